"""The engine options the in-process GPU probes share: a model (dummy weights of a shape), its tokenizer, device,
precision and token budget, and the config they make (decisions by content hash)."""

from __future__ import annotations

import argparse
from typing import Any

import quail


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="dummy:qwen3-4b")
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer directory for dummy weights")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--token-budget", type=int, default=16384)


def engine_config(args: argparse.Namespace, **more: Any) -> quail.EngineConfig:
    """The probe's engine: the options above, decisions by content hash, and `more` EngineConfig fields."""
    return quail.EngineConfig(model=args.model, device=args.device, precision=args.precision, decisions="hash",
                              token_budget=args.token_budget, tokenizer=args.tokenizer, **more)
