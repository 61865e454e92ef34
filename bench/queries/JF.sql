-- JF: an AI join with filters pushed to both inputs.
SELECT c.id AS claim_id, e.id AS evidence_id
FROM claims c JOIN evidence e
  ON AI_FILTER(PROMPT('Does the passage {1} support the claim {0}?', c.claim, e.passage))
WHERE AI_FILTER(PROMPT('Is the claim {0} about public money?', c.claim))
  AND AI_FILTER(PROMPT('Does the passage {0} cite a number?', e.passage))
