-- F1: one filter over ~300-token reviews.
SELECT id FROM reviews
WHERE AI_FILTER(PROMPT('Does the review {0} complain about the service?', body))
