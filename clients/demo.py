"""The demo: start a server with the embedded model, ingest demo texts, run AI-SQL over ADBC."""

from __future__ import annotations

import tempfile
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

from .server_process import ServerProcess

REVIEWS = [
    (1, "The pasta was cold, the sauce tasted of nothing and the waiter ignored us all evening.", 1),
    (2, "Best tiramisu I have had outside Italy. Friendly staff, we will be back next week!", 5),
    (3, "The ending of the film was a twist nobody saw coming; the whole cinema gasped.", 4),
    (4, "Delivery took two hours and the box arrived crushed. I want a refund.", 1),
    (5, "Wonderful hotel: spotless rooms, a quiet garden and a generous breakfast.", 5),
    (6, "The battery died after a week and support never answered my emails.", 2),
    (7, "A cozy bookshop with a great selection of poetry and a cat asleep by the window.", 4),
    (8, "The concert was too loud and the sound was muddy, but the band looked happy.", 3),
    (9, "Our guide was funny and knew every story about the old town. Highly recommended.", 5),
    (10, "The phone screen cracked on the first drop. Cheap plastic, poor value.", 1),
    (11, "The last chapter ties every thread together; I closed the book smiling.", 5),
    (12, "Parking was impossible and the museum closed an hour early without notice.", 2),
]

QUERIES = [
    ("Reviews the model judges positive, among those with four stars or more (stars are checked first)",
     "SELECT id, stars, body FROM reviews "
     "WHERE stars >= 4 AND AI_FILTER(PROMPT('Is {0} a positive review?', body)) ORDER BY id"),
    ("The three reviews most likely to complain about a broken product (AI_SCORE is P(yes))",
     "SELECT id, round(AI_SCORE(PROMPT('Does {0} complain about a broken or damaged product?', body)), 3) AS p_yes, "
     "body FROM reviews ORDER BY p_yes DESC LIMIT 3"),
    ("Reviews by topic (AI_CLASSIFY, then GROUP BY in DuckDB)",
     "SELECT AI_CLASSIFY(body, ['restaurant', 'travel', 'shopping', 'books and films']):labels[0]::string AS topic, "
     "count(*) AS n FROM reviews GROUP BY topic ORDER BY n DESC, topic"),
]


def _show(table: pa.Table) -> None:
    rows = table.to_pylist()
    for row in rows:
        print("   ", " | ".join(str(v) if len(str(v)) <= 70 else str(v)[:67] + "..." for v in row.values()))
    print(f"    ({len(rows)} row{'s' if len(rows) != 1 else ''})")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="quail-demo-") as data_dir:
        started = time.perf_counter()
        with ServerProcess(data_dir, "--log-level", "warning") as server:
            print(f"server ready at {server.uri} in {time.perf_counter() - started:.1f}s "
                  "(embedded SmolLM2-135M-Instruct on CPU: a tiny model, so expect weak answers; "
                  "the pipeline around it is what this demo shows)")
            with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
                ids, bodies, stars = zip(*REVIEWS)
                rows = cur.adbc_ingest("reviews", pa.table({"id": ids, "body": bodies, "stars": stars}), mode="create")
                print(f"ingested {rows} rows into table reviews\n")
                for title, sql in QUERIES:
                    print(f"-- {title}\n{sql}")
                    began = time.perf_counter()
                    cur.execute(sql)
                    table = cur.fetch_arrow_table()
                    _show(table)
                    print(f"    {time.perf_counter() - began:.2f}s\n")
        print(f"server stopped; total {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
