-- F3: a chain of three filters on one relation (each asked only of the survivors of the last).
SELECT id FROM reviews
WHERE AI_FILTER(PROMPT('Does the review {0} complain about the service?', body))
  AND AI_FILTER(PROMPT('Does the review {0} mention the price?', body))
  AND AI_FILTER(PROMPT('Was the review {0} written after an evening visit?', body))
