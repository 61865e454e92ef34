"""The plain-SQL benchmark's generated tables and its query suite (bench/plain_sql.py runs them).

- `SUITE`: the 14 TPC-H-shaped queries, by name;
- `table_sql`, `big_sql`: each table's DuckDB SELECT over range(), deterministic from the seed (`_h`, `_pick`,
  `_money`, `_date` build its columns);
- `Data`, `generate`: the tables made by DuckDB in-process as Arrow, and the SELECT that makes `big`.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

KV_ROWS = 10_000

SUITE = {
    "q01_pricing_summary": """
        SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
               avg(l_quantity) AS avg_qty, avg(l_discount) AS avg_disc, count(*) AS count_order
        FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
        GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "q02_filtered_scan": """
        SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
        WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
          AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "q03_join3_top10": """
        SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate
        FROM customer JOIN orders ON c_custkey = o_custkey JOIN lineitem ON l_orderkey = o_orderkey
        WHERE c_mktsegment = 'BUILDING' AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10""",
    "q04_join2_distinct": """
        SELECT o_orderpriority, count(DISTINCT o_orderkey) AS order_count
        FROM orders JOIN lineitem ON l_orderkey = o_orderkey
        WHERE o_orderdate >= DATE '1993-07-01' AND o_orderdate < DATE '1993-10-01' AND l_shipdate > o_orderdate
        GROUP BY o_orderpriority ORDER BY o_orderpriority""",
    "q05_join4_by_nation": """
        SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
        FROM customer JOIN orders ON c_custkey = o_custkey JOIN lineitem ON l_orderkey = o_orderkey
             JOIN nation ON c_nationkey = n_nationkey
        WHERE n_regionkey = 2 AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
        GROUP BY n_name ORDER BY revenue DESC, n_name""",
    "q06_top20": """
        SELECT l_orderkey, l_linenumber, l_extendedprice FROM lineitem
        ORDER BY l_extendedprice DESC, l_orderkey, l_linenumber LIMIT 20""",
    "q07_window_rank": """
        SELECT c_nationkey, c_custkey, c_acctbal, rn FROM (
            SELECT c_nationkey, c_custkey, c_acctbal,
                   row_number() OVER (PARTITION BY c_nationkey ORDER BY c_acctbal DESC, c_custkey) AS rn
            FROM customer) ranked
        WHERE rn <= 3 ORDER BY c_nationkey, rn""",
    "q08_window_running_sum": """
        SELECT y, m, revenue, sum(revenue) OVER (ORDER BY y, m) AS running FROM (
            SELECT EXTRACT(year FROM o_orderdate) AS y, EXTRACT(month FROM o_orderdate) AS m,
                   sum(o_totalprice) AS revenue
            FROM orders GROUP BY EXTRACT(year FROM o_orderdate), EXTRACT(month FROM o_orderdate)) monthly
        ORDER BY y, m""",
    "q09_distinct_count": """
        SELECT l_shipmode, count(DISTINCT l_partkey) AS parts, count(*) AS lines
        FROM lineitem GROUP BY l_shipmode ORDER BY l_shipmode""",
    "q10_case_promo_share": """
        SELECT 100 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
               / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
        FROM lineitem JOIN part ON l_partkey = p_partkey
        WHERE l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'""",
    "q11_case_counts": """
        SELECT l_shipmode,
               sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high,
               sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END) AS low
        FROM orders JOIN lineitem ON o_orderkey = l_orderkey
        WHERE l_shipmode IN ('MAIL', 'SHIP') AND l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
        GROUP BY l_shipmode ORDER BY l_shipmode""",
    "q12_left_join_distribution": """
        SELECT c_count, count(*) AS custdist FROM (
            SELECT c_custkey, count(o_orderkey) AS c_count
            FROM customer LEFT JOIN orders ON c_custkey = o_custkey AND o_orderpriority <> '5-LOW'
            GROUP BY c_custkey) counts
        GROUP BY c_count ORDER BY custdist DESC, c_count DESC""",
    "q13_in_subquery_having": """
        SELECT o_orderkey, o_custkey, o_totalprice, sum(l_quantity) AS qty
        FROM orders JOIN lineitem ON o_orderkey = l_orderkey
        WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 170)
        GROUP BY o_orderkey, o_custkey, o_totalprice ORDER BY o_totalprice DESC, o_orderkey LIMIT 20""",
    "q14_like_in_group": """
        SELECT p_brand, count(*) AS lines, avg(l_quantity) AS avg_qty
        FROM lineitem JOIN part ON l_partkey = p_partkey
        WHERE p_type NOT LIKE 'STANDARD%' AND p_size IN (3, 9, 14, 19, 23, 36, 45, 49)
        GROUP BY p_brand ORDER BY lines DESC, p_brand LIMIT 10""",
}


def _h(column: int, seed: int, modulo: int) -> str:
    """SQL for a deterministic BIGINT in [0, modulo) of row `i`: DuckDB's hash of (i, column, seed)."""
    return f"CAST(hash(i, {column}, {seed}) % {modulo} AS BIGINT)"


def _pick(column: int, seed: int, values: list[str]) -> str:
    """SQL choosing one of `values` for row `i` by hash."""
    items = ", ".join(f"'{v}'" for v in values)
    return f"([{items}])[1 + {_h(column, seed, len(values))}]"


def _money(column: int, seed: int, low_cents: int, high_cents: int) -> str:
    """SQL for a DOUBLE amount in [low, high) with whole cents."""
    return f"CAST({low_cents} + {_h(column, seed, high_cents - low_cents)} AS DOUBLE) / 100"


def _date(column: int, seed: int, first: str, days: int) -> str:
    return f"DATE '{first}' + CAST({_h(column, seed, days)} AS INTEGER)"


def table_sql(rows: int, seed: int) -> dict[str, str]:
    """Each generated table's DuckDB SELECT over range(): kv and the suite's TPC-H-shaped tables. Contract:
    lineitem max(1000, rows // 10) rows, 4 lines an order; every foreign key names an existing row."""
    lines = max(1000, rows // 10)
    orders = (lines + 3) // 4
    customers = max(25, orders // 10)
    parts = max(20, lines // 50)
    segments = ["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"]
    priorities = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]
    modes = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]
    types = ["PROMO BRUSHED TIN", "STANDARD POLISHED STEEL", "ECONOMY ANODIZED COPPER", "PROMO PLATED BRASS",
             "LARGE BURNISHED NICKEL", "MEDIUM PLATED TIN"]
    return {
        "kv": f"SELECT i AS k, {_h(1, seed, 1_000_000_000)} AS v FROM range({KV_ROWS}) t(i)",
        "nation": "SELECT CAST(i AS INTEGER) AS n_nationkey, 'NATION_' || CAST(i AS VARCHAR) AS n_name, "
                  "CAST(i % 5 AS INTEGER) AS n_regionkey FROM range(25) t(i)",
        "customer": f"SELECT i AS c_custkey, 'Customer#' || lpad(CAST(i AS VARCHAR), 9, '0') AS c_name, "
                    f"CAST({_h(1, seed, 25)} AS INTEGER) AS c_nationkey, {_pick(2, seed, segments)} AS c_mktsegment, "
                    f"{_money(3, seed, -100_000, 1_000_000)} AS c_acctbal FROM range({customers}) t(i)",
        "orders": f"SELECT i AS o_orderkey, {_h(1, seed, customers)} AS o_custkey, "
                  f"{_pick(2, seed, ['F', 'O', 'P'])} AS o_orderstatus, "
                  f"{_money(3, seed, 100_000, 50_000_000)} AS o_totalprice, "
                  f"{_date(4, seed, '1992-01-01', 2400)} AS o_orderdate, "
                  f"{_pick(5, seed, priorities)} AS o_orderpriority FROM range({orders}) t(i)",
        "lineitem": f"SELECT i // 4 AS l_orderkey, CAST(i % 4 + 1 AS INTEGER) AS l_linenumber, "
                    f"{_h(1, seed, parts)} AS l_partkey, CAST(1 + {_h(2, seed, 50)} AS INTEGER) AS l_quantity, "
                    f"{_money(3, seed, 100, 10_000_000)} AS l_extendedprice, "
                    f"CAST({_h(4, seed, 11)} AS DOUBLE) / 100 AS l_discount, "
                    f"CAST({_h(5, seed, 9)} AS DOUBLE) / 100 AS l_tax, "
                    f"{_pick(6, seed, ['A', 'N', 'R'])} AS l_returnflag, {_pick(7, seed, ['F', 'O'])} AS l_linestatus, "
                    f"{_date(8, seed, '1992-01-02', 2500)} AS l_shipdate, {_pick(9, seed, modes)} AS l_shipmode "
                    f"FROM range({lines}) t(i)",
        "part": f"SELECT i AS p_partkey, 'Brand#' || CAST(11 + {_h(1, seed, 45)} AS VARCHAR) AS p_brand, "
                f"{_pick(2, seed, types)} AS p_type, CAST(1 + {_h(3, seed, 50)} AS INTEGER) AS p_size "
                f"FROM range({parts}) t(i)",
    }


def big_sql(rows: int, seed: int) -> str:
    """The SELECT that makes `big`: `rows` rows, g in 100 groups, x BIGINT, y DOUBLE."""
    return (f"SELECT CAST({_h(1, seed, 100)} AS INTEGER) AS g, {_h(2, seed, 1_000_000)} AS x, "
            f"CAST({_h(3, seed, 1_000_000)} AS DOUBLE) / 1000 AS y FROM range({rows}) t(i)")


@dataclass
class Data:
    """The generated tables (kv and the suite's) as Arrow, and how to make `big`."""
    tables: dict[str, pa.Table]
    big_sql: str


def generate(rows: int, seed: int) -> Data:
    """The tables of table_sql, made by DuckDB in-process."""
    with duckdb.connect() as con:
        tables = {name: con.sql(sql).to_arrow_table() for name, sql in table_sql(rows, seed).items()}
    return Data(tables, big_sql(rows, seed))
