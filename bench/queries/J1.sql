-- J1: one AI join, reviews x aspects.
SELECT r.id AS review_id, a.id AS aspect_id
FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect))
