-- JEQ: an AI join plus an ordinary equality condition (evaluated first, in DuckDB).
SELECT a.id AS first_id, b.id AS second_id
FROM evidence a JOIN evidence b
  ON a.topic = b.topic AND a.id < b.id
 AND AI_FILTER(PROMPT('Do the passages {0} and {1} reach the same conclusion?', a.passage, b.passage))
