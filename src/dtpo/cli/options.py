"""Command-line options generated from a configuration tree, so every flag is declared once.

Each field of a tree (:class:`~dtpo.core.config.RunConfig` for ``train`` and ``bench``, the simulate and
plan trees for theirs) that names a flag becomes a typer option with the field's documentation as its help; a
field marked as the argument becomes the command's positional argument. A command built by
:func:`config_command` receives the resolved tree: the defaults (or, for the run's tree, the file given with
``--config``) with every flag that was typed on the command line applied on top.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from typer._click.core import ParameterSource  # typer vendors click

from dtpo.core.config import RunConfig
from dtpo.core.config_section import ConfigField, Tree, tree_fields

ConfigHandler = Callable[..., None]


def _param_name(f: ConfigField) -> str:
    return f.name if f.argument else f"{f.section}__{f.name}"


def _option(f: ConfigField, default: Any, help_values: dict[str, Any], hidden: bool) -> Any:
    help_text = f.help.format_map(help_values) if help_values else f.help
    if f.argument:
        return typer.Argument(default, help=help_text, show_default=False)
    assert f.flag is not None
    names = [f"{f.flag}/--no-{f.flag[2:]}"] if f.type is bool and f.negatable else [f.flag]
    if f.short:
        names.append(f.short)
    return typer.Option(default, *names, help=help_text, show_default=default is not None, hidden=hidden)


def _annotation(f: ConfigField) -> Any:
    return f.type | None if f.optional else f.type


def config_command(handler: ConfigHandler, *, tree: type[Tree] = RunConfig, exclude: Iterable[str] = (),
                   extra: Iterable[inspect.Parameter] = (), defaults: dict[str, Any] | None = None,
                   hidden: Iterable[str] = (), help_values: dict[str, Any] | None = None,
                   doc: str | None = None, fixed: dict[str, Any] | None = None, arguments: Iterable[str] = (),
                   pass_context: bool = False) -> Callable[..., None]:
    """A typer command function whose options are the tree's flags plus ``extra`` (and ``--config`` for the
    run's tree).

    Args:
        handler: Called as ``handler(config, **extra_values)`` with the resolved tree.
        tree: The configuration tree whose fields are the flags.
        exclude: Field paths (``"launch.workers"``) that this command does not take as flags.
        extra: Options of this command only (``inspect.Parameter`` with a ``typer.Option`` default).
        defaults: This command's own defaults for some fields, by path (``{"workload.name": "mlp"}``).
        hidden: Field paths taken as flags but left out of ``--help`` (flags a command only refuses).
        help_values: Values for ``{NAME}`` placeholders in the fields' documentation (limits that live in a
            layer above the tree's).
        doc: The command's help (default: the handler's docstring).
        fixed: Values this command sets itself, by path (fields it does not take as flags).
        arguments: Field paths this command takes as its (required) positional argument instead of a flag.
        pass_context: Call the handler as ``handler(ctx, config, **extra_values)``.
    """
    fixed = dict(fixed or {})
    positional = set(arguments)
    defaults = {**(defaults or {}), **{path: ... for path in positional}}
    excluded, hide = set(exclude) | set(fixed), set(hidden)
    fields = [dataclasses.replace(f, argument=True, optional=False) if f.path in positional else f
              for f in tree_fields(tree) if (f.flag or f.argument or f.path in positional) and f.path not in excluded]
    extra = list(extra)
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    if tree is RunConfig:
        params.append(inspect.Parameter(
            "config_file", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
            default=typer.Option(None, "--config", help="Start from this configuration (a run directory's "
                                 "config.json, or JSON/TOML); flags typed on the command line override it.")))
    params += [inspect.Parameter(_param_name(f), inspect.Parameter.KEYWORD_ONLY, annotation=_annotation(f),
                                 default=_option(f, defaults.get(f.path, f.default), help_values or {},
                                                 f.path in hide))
               for f in fields]
    params += extra
    extra_names = [p.name for p in extra]

    def command(**kwargs: Any) -> None:
        ctx: typer.Context = kwargs.pop("ctx")
        config_file: Path | None = kwargs.pop("config_file", None)
        extras = {name: kwargs.pop(name) for name in extra_names}
        if tree is RunConfig:
            config: Tree = resolve_config(ctx, config_file, fields, kwargs)
        else:
            config = tree_from_values(tree, fields, kwargs, fixed)
        if pass_context:
            handler(ctx, config, **extras)
        else:
            handler(config, **extras)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc if doc is not None else handler.__doc__
    return command


def tree_from_values(tree: type[Tree], fields: list[ConfigField], values: dict[str, Any],
                     fixed: dict[str, Any] | None = None) -> Tree:
    """The tree with the fields' values as parsed (their defaults where not typed) and the command's ``fixed``
    values (by path)."""
    data: dict[str, dict[str, Any]] = {name: {} for name in tree.SECTIONS}
    for path, value in (fixed or {}).items():
        section, name = path.split(".", 1)
        data[section][name] = value
    for f in fields:
        data[f.section][f.name] = values[_param_name(f)]
    return tree.from_dict(data)


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
