-- AG: one filter over agent traces; rows of one task share long prefixes.
SELECT id FROM traces
WHERE AI_FILTER(PROMPT('In the trace {0}, did the last step make the task fail?', history))
