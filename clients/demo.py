"""The demo: a server with the embedded model; over ADBC a ranking, EXPLAIN ANALYZE, a watched and cancelled query,
then generation: fields extracted from tickets (AI_EXTRACT) and a summary of complaints per product (AI_AGG)."""

from __future__ import annotations

import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
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

TICKETS = [
    (1, "kettle", "Order 5521: the kettle leaks from the lid and I want a refund."),
    (2, "kettle", "Order 5604: my kettle is very loud when it boils."),
    (3, "lamp", "Order 6120: the desk lamp flickers every evening."),
    (4, "lamp", "Order 6187: the lamp is far too dim to read by."),
]
EXTRACT = ("SELECT id, AI_EXTRACT(body, {'order': 'What is the order number?', 'problem': 'What is wrong?'}) AS fields "
           "FROM tickets ORDER BY id")
AGG = ("SELECT product, count(*) AS tickets, AI_AGG(body, 'Name the complaints in one short sentence.', "
       "{'max_tokens': 40}) AS complaints FROM tickets GROUP BY product ORDER BY product")


def reviews_table() -> pa.Table:
    """REVIEWS as the table `reviews` (id, body, stars)."""
    ids, bodies, stars = zip(*REVIEWS)
    return pa.table({"id": ids, "body": bodies, "stars": stars})


SCORE = ("SELECT id, stars, round(AI_SCORE(PROMPT('Is {0} a positive review?', body)), 3) AS p_yes, body "
         "FROM reviews ORDER BY p_yes DESC, id")
FILTER = "SELECT id FROM reviews WHERE stars >= 4 AND AI_FILTER(PROMPT('Does {0} recommend the place?', body))"
LONG = "SELECT id FROM visits WHERE AI_FILTER(PROMPT('Does {0} mention the staff?', body))"
VISITS = 3000  # rows of the long query: long enough on a CPU to be watched and cancelled


def _show(table: pa.Table) -> None:
    rows = table.to_pylist()
    for row in rows:
        texts = (" ".join(str(v).split()) for v in row.values())  # a value's lines and runs of blanks as spaces
        print("   ", " | ".join(t if len(t) <= 70 else t[:67] + "..." for t in texts))
    print(f"    ({len(rows)} row{'s' if len(rows) != 1 else ''})")


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    first = 0
    while first < len(order):
        last = first
        while last + 1 < len(order) and values[order[last + 1]] == values[order[first]]:
            last += 1
        for k in range(first, last + 1):
            ranks[order[k]] = (first + last) / 2 + 1
        first = last + 1
    return ranks


def _rank_agreement(scores: list[float], stars: list[int]) -> float:
    """Spearman's rank correlation of the model's scores with the stars."""
    a, b = _ranks(scores), _ranks(stars)
    mean = (len(a) + 1) / 2
    covariance = sum((x - mean) * (y - mean) for x, y in zip(a, b))
    return covariance / (sum((x - mean) ** 2 for x in a) * sum((y - mean) ** 2 for y in b)) ** 0.5


def _score(cur) -> None:
    print(f"-- 1. Rank the reviews by the model's P(yes) (AI_SCORE: one prefill a row, no decoding)\n{SCORE}")
    cur.execute(SCORE)
    table = cur.fetch_arrow_table()
    _show(table)
    agreement = _rank_agreement(table["p_yes"].to_pylist(), table["stars"].to_pylist())
    print(f"    rank correlation of p_yes with the stars: {agreement:+.2f} (1 = the stars' order; "
          "the embedded 135M model is close to guessing: serve a real model with --model for real answers)\n")


def _explain(cur) -> None:
    print("-- 2. EXPLAIN ANALYZE: the plan, run; tokens computed and cached, time against the speed of light.\n"
          "--    A new question about the same reviews continues their KV left in the pool by query 1.")
    cur.execute("EXPLAIN ANALYZE " + FILTER)
    for line in cur.fetch_arrow_table().column(0).to_pylist():
        print("   ", line)
    print()


def _watch_and_cancel(conn, cur) -> None:
    bodies = [f"Visit {i}: {REVIEWS[i % len(REVIEWS)][1]}" for i in range(VISITS)]
    cur.adbc_ingest("visits", pa.table({"id": list(range(VISITS)), "body": bodies}), mode="create")
    print(f"-- 3. A long query over {VISITS:,} rows, watched in the quail_queries system table, then cancelled"
          f"\n{LONG}")
    outcome: list = []
    long_cur = conn.cursor()

    def run() -> None:
        try:
            long_cur.execute(LONG)
            outcome.append(f"{long_cur.fetch_arrow_table().num_rows} rows: it had finished")
        except adbc_driver_manager.Error as err:
            outcome.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")

    thread = threading.Thread(target=run)
    thread.start()
    watch = ("SELECT elapsed_s, requests, tokens_done, tokens_planned, queue_place FROM quail_queries "
             f"WHERE query = '{LONG.replace(chr(39), chr(39) * 2)}'")
    seen: set[int] = set()
    for _ in range(30):  # until the progress has moved twice
        time.sleep(0.5)
        cur.execute(watch)
        for row in cur.fetch_arrow_table().to_pylist():
            if row["tokens_done"] not in seen:
                seen.add(row["tokens_done"])
                print(f"    after {row['elapsed_s']:.1f}s: {row['tokens_done']:,} of {row['tokens_planned']:,} "
                      f"tokens planned so far ({row['requests']:,} requests); place in the model's queue: "
                      f"{row['queue_place']}")
        if len(seen) >= 3:
            break
    began = time.perf_counter()
    long_cur.adbc_cancel()
    thread.join(60)
    long_cur.close()
    print(f"    cancel asked; {time.perf_counter() - began:.2f}s later the client had {outcome[0]}")
    for _ in range(50):
        cur.execute(watch)
        if cur.fetch_arrow_table().num_rows == 0:
            break
        time.sleep(0.1)
    print(f"    {time.perf_counter() - began:.2f}s after the cancel (the forward pass in flight ends first), "
          "quail_queries no longer lists it\n")


def _generate(cur) -> None:
    ids, products, bodies = zip(*TICKETS)
    cur.adbc_ingest("tickets", pa.table({"id": ids, "product": products, "body": bodies}), mode="create")
    print(f"-- 4. Generation: fields extracted from support tickets, as JSON that follows a schema (AI_EXTRACT)\n"
          f"{EXTRACT}")
    cur.execute(EXTRACT)
    _show(cur.fetch_arrow_table())
    print(f"-- 5. A summary of the complaints per product (AI_AGG: each group's texts in one prompt, the\n"
          f"--    instruction first, its KV shared by every group)\n{AGG}")
    cur.execute(AGG)
    _show(cur.fetch_arrow_table())
    print()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="quail-demo-") as data_dir:
        started = time.perf_counter()
        # Passes of 512 tokens: on a CPU a pass takes a second or two, and query 3's progress moves a pass at a time.
        with ServerProcess(data_dir, "--log-level", "warning", "--token-budget", "512") as server:
            print(f"server ready at {server.uri} in {time.perf_counter() - started:.1f}s (the embedded "
                  "SmolLM2-135M-Instruct on the CPU: a tiny model for trying the pipeline; its answers are weak)")
            with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
                rows = cur.adbc_ingest("reviews", reviews_table(), mode="create")
                print(f"ingested {rows} rows into table reviews over ADBC\n")
                _score(cur)
                _explain(cur)
                _watch_and_cancel(conn, cur)
                _generate(cur)
        print(f"server stopped; total {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
