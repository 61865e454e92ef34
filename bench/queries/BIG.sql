-- BIG: three filters, then two joins of reports against aliases of terms (~2,500-token anchors).
SELECT r.id AS report_id, t.id AS term_id, u.id AS unexpected_id
FROM reports r
JOIN terms t ON AI_FILTER(PROMPT('Does the report {0} describe {1}?', r.text, t.term))
JOIN terms u ON AI_FILTER(PROMPT('Is {1} an unexpected finding in the report {0}?', r.text, u.term))
WHERE AI_FILTER(PROMPT('Does the report {0} describe an adverse event?', r.text))
  AND AI_FILTER(PROMPT('Was the patient in the report {0} hospitalised?', r.text))
  AND AI_FILTER(PROMPT('Does the report {0} mention a dose change?', r.text))
