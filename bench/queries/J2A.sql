-- J2A: two AI joins against aliases of one anchor table.
SELECT c.id AS claim_id, s.id AS supporting_id, r.id AS refuting_id
FROM claims c
JOIN evidence s ON AI_FILTER(PROMPT('Does the passage {1} support the claim {0}?', c.claim, s.passage))
JOIN evidence r ON AI_FILTER(PROMPT('Does the passage {1} refute the claim {0}?', c.claim, r.passage))
