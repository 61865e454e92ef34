"""pandas and polars over a Quail server through ADBC: a DataFrame written as a table, AI-SQL read back into one.

    python -m quail.clients.dataframes_example [grpc://HOST:PORT]

Needs `pip install quail-server[client] pandas polars`; the server's default
address when none is given.
"""

from __future__ import annotations

import sys

import adbc_driver_flightsql.dbapi as flight_sql
import pandas as pd
import polars as pl
import pyarrow as pa

TICKETS = {
    "id": [1, 2, 3, 4],
    "text": ["My order arrived broken and nobody answers my emails.", "Thanks, the new plan works great!",
             "How do I change the address on my invoice?", "The app crashes every time I open settings."],
}
SCORED = ("SELECT id, round(AI_SCORE(PROMPT('Is {0} a complaint?', text)), 3) AS complaint, text "
          "FROM tickets ORDER BY complaint DESC")
LABELLED = ("SELECT id, AI_CLASSIFY(text, ['billing', 'bug report', 'delivery', 'praise']):labels[0]::string AS "
            "topic, text FROM tickets_pl ORDER BY id")


def with_pandas(uri: str) -> pd.DataFrame:
    """Write the tickets from pandas as table `tickets`, then score each one with pd.read_sql."""
    with flight_sql.connect(uri, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest("tickets", pa.Table.from_pandas(pd.DataFrame(TICKETS), preserve_index=False),
                            mode="replace")
        return pd.read_sql(SCORED, conn)


def with_polars(uri: str) -> pl.DataFrame:
    """Write the tickets from polars as table `tickets_pl`, then label each one's topic with pl.read_database."""
    with flight_sql.connect(uri, autocommit=True) as conn:
        pl.DataFrame(TICKETS).write_database("tickets_pl", conn, if_table_exists="replace", engine="adbc")
        return pl.read_database(LABELLED, conn)


def main(uri: str = "grpc://127.0.0.1:8815") -> None:
    print(with_pandas(uri).to_string(index=False))
    print(with_polars(uri))


if __name__ == "__main__":
    main(*sys.argv[1:2])
