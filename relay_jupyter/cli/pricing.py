"""``jupyter relay pricing``: the price table the broker charges by (core/pricing.py): the published list
prices merged with ``c.RelayApp.pricing`` overrides, USD per million tokens; ``--model M`` says which entry a
model id is priced by (its own, a prefix entry, or — fail closed — the most expensive rates)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``pricing`` to the ``jupyter relay`` parser."""
    p = subparsers.add_parser("pricing", help="the price table (list prices + c.RelayApp.pricing), USD per MTok")
    p.add_argument("--model", metavar="ID", action="append", help="show which entry prices this model id (repeatable)")
    p.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_pricing)


def _entry(pricing: Any, model: str) -> str:
    table = pricing.table()
    if model in table:
        return model
    prefix = max((k for k in table if model.startswith(k)), key=len, default=None)
    return prefix if prefix is not None else "(unknown: the most expensive rates)"


def _valid(model: Any, rates: Any) -> bool:
    from ..core.pricing import Pricing

    try:
        Pricing({model: rates})
    except Exception:  # noqa: BLE001 - only to name the entry the real error is about
        return False
    return True


def _cmd_pricing(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ..core.errors import Code, ConfigRefusal
    from ..core.pricing import Pricing
    from .serve import broker_config

    config = broker_config(argparse.Namespace(config=args.config, data_dir=None))
    try:
        pricing = Pricing(config.pricing or None)
    except ValidationError as exc:
        bad = next((m for m, rates in dict(config.pricing or {}).items() if not _valid(m, rates)), "an entry")
        first = exc.errors()[0]
        raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp.pricing[{bad!r}]: "
                            f"{'.'.join(str(x) for x in first.get('loc', ())) or 'rates'}: {first['msg']}") from None
    except TypeError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp.pricing: {exc}") from None
    table = pricing.table()
    models = [m.strip() for m in (args.model or []) if m and m.strip()]
    if args.json:
        out: dict[str, Any] = {"unit": "USD per million tokens", "prices": table}
        if models:
            out["models"] = {m: {"entry": _entry(pricing, m), **pricing.price(m).model_dump()} for m in models}
        print(json.dumps(out, indent=2))
        return 0
    if models:
        for m in models:
            p = pricing.price(m)
            print(f"{m}: {_entry(pricing, m)}  input {p.input:g}  output {p.output:g}  "
                  f"cache write {p.cache_write:g}  cache read {p.cache_read:g}")
        return 0
    width = max(len(k) for k in table)
    print(f"{'model':<{width}}  {'input':>8}  {'output':>8}  {'cache write':>11}  {'cache read':>10}   (USD per MTok)")
    for model, p in table.items():
        print(f"{model:<{width}}  {p['input']:>8g}  {p['output']:>8g}  {p['cache_write']:>11g}  {p['cache_read']:>10g}")
    return 0
