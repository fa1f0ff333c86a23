"""Command-line options generated from the configuration tree, so every flag is declared once.

Each field of :mod:`dtpo.core.config` that names a flag becomes a typer option with the field's
documentation as its help. A command built by :func:`config_command` receives the resolved
:class:`~dtpo.core.config.RunConfig`: the defaults, or the file given with ``--config``, with every flag that
was typed on the command line applied on top.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from typer._click.core import ParameterSource  # typer vendors click

from dtpo.core.config import ConfigField, RunConfig, config_fields

ConfigHandler = Callable[..., None]


def _param_name(f: ConfigField) -> str:
    return f"{f.section}__{f.name}"


def _option(f: ConfigField, default: Any) -> Any:
    assert f.flag is not None
    names = [f"{f.flag}/--no-{f.flag[2:]}"] if f.type is bool else [f.flag]
    if f.short:
        names.append(f.short)
    return typer.Option(default, *names, help=f.help, show_default=default is not None)


def _annotation(f: ConfigField) -> Any:
    return f.type | None if f.optional else f.type


def config_command(handler: ConfigHandler, *, exclude: Iterable[str] = (),
                   extra: Iterable[inspect.Parameter] = (), defaults: dict[str, Any] | None = None
                   ) -> Callable[..., None]:
    """A typer command function whose options are the tree's flags plus ``--config`` and ``extra``.

    Args:
        handler: Called as ``handler(config, **extra_values)`` with the resolved :class:`RunConfig`.
        exclude: Field paths (``"launch.workers"``) that this command does not take as flags.
        extra: Options of this command only (``inspect.Parameter`` with a ``typer.Option`` default).
        defaults: This command's own defaults for some fields, by path (``{"workload.name": "mlp"}``).
    """
    defaults = defaults or {}
    excluded = set(exclude)
    fields = [f for f in config_fields() if f.flag and f.path not in excluded]
    extra = list(extra)
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
              inspect.Parameter("config_file", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                                default=typer.Option(None, "--config", help="Start from this configuration (a run "
                                                     "directory's config.json, or JSON/TOML); flags typed "
                                                     "on the command line override it."))]
    params += [inspect.Parameter(_param_name(f), inspect.Parameter.KEYWORD_ONLY,
                                 default=_option(f, defaults.get(f.path, f.default)), annotation=_annotation(f))
               for f in fields]
    params += extra
    extra_names = [p.name for p in extra]

    def command(**kwargs: Any) -> None:
        ctx: typer.Context = kwargs.pop("ctx")
        config_file: Path | None = kwargs.pop("config_file")
        extras = {name: kwargs.pop(name) for name in extra_names}
        config = resolve_config(ctx, config_file, fields, kwargs)
        handler(config, **extras)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = handler.__doc__
    return command


def resolve_config(ctx: typer.Context, config_file: Path | None, fields: list[ConfigField],
                   values: dict[str, Any]) -> RunConfig:
    """The tree: ``config_file`` (or the defaults) with the flags typed on the command line applied."""
    base = RunConfig.load(config_file) if config_file is not None else RunConfig()
    data = base.to_dict()
    if config_file is not None:
        # A reproduced run gets a run directory of its own unless one is named, and starts from the beginning
        # unless --resume is typed.
        data["launch"]["run_dir"] = None
        data["launch"]["overwrite"] = False
        data["checkpoint"]["resume"] = None
    for f in fields:
        name = _param_name(f)
        if config_file is None or ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                                      ParameterSource.ENVIRONMENT):
            data[f.section][f.name] = values[name]
    return RunConfig.from_dict(data)
