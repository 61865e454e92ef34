-- J3: a chain of three AI joins.
SELECT c.id AS claim_id, e.id AS evidence_id, r.id AS review_id, a.id AS aspect_id
FROM claims c
JOIN evidence e ON AI_FILTER(PROMPT('Does the passage {1} support the claim {0}?', c.claim, e.passage))
JOIN reviews r ON AI_FILTER(PROMPT('Does the passage {0} describe the same kind of event as the review {1}?', e.passage, r.body))
JOIN aspects a ON AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect))
WHERE r.stars = 1
