"""The server's flags take their defaults from ServerConfig, written there once."""
from __future__ import annotations

from kcoral_server.cli import build_parser, config_from_args
from kcoral_server.config import ServerConfig


def test_no_flags_give_the_configs_own_defaults() -> None:
    from_flags = config_from_args(build_parser().parse_args(["--cpu-workers", "1"]))
    defaults = ServerConfig(cpu_workers=1)
    differ = {name: (getattr(from_flags, name), getattr(defaults, name))
              for name in ServerConfig.model_fields if getattr(from_flags, name) != getattr(defaults, name)}
    assert not differ, differ


def test_help_shows_sizes_in_gib() -> None:
    text = " ".join(build_parser().format_help().split())   # whatever the wrapping width
    assert "largest request body (default 2 GiB)" in text
    assert "(default 2147483648)" not in text
