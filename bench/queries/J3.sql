-- J3: a chain of three AI joins (claims -> evidence -> evidence -> aspects).
SELECT c.id AS claim_id, e.id AS evidence_id, f.id AS related_id, a.id AS aspect_id
FROM claims c
JOIN evidence e ON AI_FILTER(PROMPT('Does the passage {1} support the claim {0}?', c.claim, e.passage))
JOIN evidence f ON AI_FILTER(PROMPT('Does the passage {1} continue the argument of {0}?', e.passage, f.passage))
JOIN aspects a ON AI_FILTER(PROMPT('Does the passage {0} touch on {1}?', f.passage, a.aspect))
