"""MkDocs hook: the reference pages the code itself describes, written at build time.

- ``reference/openapi.json`` and ``reference/http-operations.md``: the OpenAPI document that
  ``GET /api/v1/openapi.json`` serves (``webapp/openapi.py``), and a page listing every operation
  in it with its parameters, body and answers;
- ``reference/cli.md``: every ``spacejobs`` command (``spacejobs.webapp.cli:main``), from click itself;
- ``reference/python.md``: the public face, every name ``import spacejobs`` gives (its
  ``__all__``), with its signature and its docstring.

The configuration page is not made here: it is ``python -m models.settings``'s table, kept in
``docs/reference/configuration.md`` and checked by ``tests/unit/test_settings.py``, so it reads
the same on the site and in the repository.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    document = openapi_document()
    files.append(File.generated(config, "reference/openapi.json",
                                content=json.dumps(document, indent=2, sort_keys=True) + "\n"))
    files.append(File.generated(config, "reference/http-operations.md", content=operations_page(document)))
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/python.md", content=python_page()))
    return files


# ----------------------------------------------------------------------------------- Python

def python_page() -> str:
    """Every public name of ``spacejobs``, in its order: signature, then docstring; a class's
    public methods and properties under it."""
    import inspect

    import spacejobs

    lines = ["# Python API", "",
             "What `import spacejobs` gives, and nothing else is promised: everything under",
             "`spacejobs.*` beside these names is the house's own. Written from the code when the",
             "site is built (`spacejobs.__all__`, each name's signature and docstring).", ""]
    for name in spacejobs.__all__:
        value = getattr(spacejobs, name)
        lines += [f"## `{name}`", "", "```python", _signature(name, value), "```", ""]
        lines += [inspect.getdoc(value) or "", ""]
        if inspect.isclass(value) and not issubclass(value, BaseException):
            for member, attribute in inspect.getmembers(value):
                if member.startswith("_") or member in getattr(value, "model_fields", {}):
                    continue
                if not (inspect.isfunction(attribute) or isinstance(attribute, property)):
                    continue
                if getattr(attribute, "__module__", value.__module__).startswith("pydantic"):
                    continue
                doc = inspect.getdoc(attribute) or ""
                lines += [f"### `{name}.{member}`", "", "```python",
                          _signature(member, attribute.fget if isinstance(attribute, property)
                                     else attribute, prop=isinstance(attribute, property)),
                          "```", "", doc, ""]
    return "\n".join(lines) + "\n"


def _signature(name: str, value: Any, *, prop: bool = False) -> str:
    import inspect

    if prop:
        return f"{name}  # property"
    try:
        return f"{name}{inspect.signature(value)}"
    except (TypeError, ValueError):
        return name


# ----------------------------------------------------------------------------------- HTTP

def openapi_document() -> dict[str, Any]:
    """The document a web process with only the built-in kinds serves.

    The app is built but never connects: a database URL is needed to build it, not to describe
    it. The bench, demo and extra kinds are switched off, so the page lists what every
    deployment submits, whatever the environment of the build.
    """
    os.environ.setdefault("DATABASE_URL", "postgresql://docs@127.0.0.1/unused")
    for name in ("SPACEJOBS_BENCH_KINDS", "SPACEJOBS_DEMO_KINDS", "SPACEJOBS_EXTRA_KIND_MODULES"):
        os.environ.pop(name, None)
    from spacejobs.models.settings import reload_settings

    reload_settings()
    from spacejobs.webapp import create_app
    from spacejobs.webapp.openapi import document

    app = create_app({"RATELIMIT_STORAGE_URI": "memory://"})
    return document(app)


def operations_page(document: dict[str, Any]) -> str:
    lines = [
        "# HTTP operations",
        "",
        "Every operation of the JSON API, as the OpenAPI 3.1 document describes it. This page and",
        "[`openapi.json`](openapi.json) are written from `webapp/openapi.py` when the site is built;",
        "a running web serves the same document at `GET /api/v1/openapi.json` (with the kinds it",
        "runs). What the answers mean, and the audit log: [HTTP API](http-api.md).",
        "",
        "| method | path | what |",
        "|---|---|---|",
    ]
    operations = [(path, method, op) for path, item in document["paths"].items()
                  for method, op in item.items() if method in HTTP_METHODS]
    for path, method, op in operations:
        lines.append(f"| `{method.upper()}` | [`{path}`](#{op['operationId']}) | {op['summary']} |")
    for path, method, op in operations:
        lines += ["", f"## `{method.upper()} {path}` {{ #{op['operationId']} }}", "", op["summary"] + ".", ""]
        if op.get("security") == []:
            lines += ["Public: no token.", ""]
        else:
            lines += ["Needs `Authorization: Bearer <token>`.", ""]
        if op["parameters"]:
            lines += ["| parameter | in | required | schema |", "|---|---|---|---|"]
            for parameter in op["parameters"]:
                lines.append(f"| `{parameter['name']}` | {parameter['in']} | "
                             f"{'yes' if parameter.get('required') else 'no'} | "
                             f"{_schema_text(parameter['schema'])} |")
            lines.append("")
        if "requestBody" in op:
            body = op["requestBody"]["content"]["application/json"]["schema"]
            lines += [f"Body (`application/json`): {_schema_text(body)}.", ""]
        lines += ["| status | answer | content |", "|---|---|---|"]
        for status, answer in op["responses"].items():
            content = ", ".join(f"`{kind}` {_schema_text(media['schema'])}"
                                for kind, media in answer.get("content", {}).items())
            lines.append(f"| {status} | {_cell(answer['description'])} | {content or '—'} |")
    lines += ["", "## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += [f"### {name} {{ #schema-{name.lower()} }}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        lines += ['??? note "JSON Schema"', "", "    ```json"]
        lines += ["    " + line for line in json.dumps(schema, indent=2).splitlines()]
        lines += ["    ```", ""]
    return "\n".join(lines) + "\n"


def _schema_text(schema: dict[str, Any]) -> str:
    reference = schema.get("$ref")
    if reference:
        name = reference.rsplit("/", 1)[1]
        # an error answer narrows Error's `code` to the codes its description already lists
        return f"[{name}](#schema-{name.lower()})"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    shown = schema.get("type", "any")
    if "format" in schema:
        shown += f" ({schema['format']})"
    return f"`{shown}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# ------------------------------------------------------------------------------------ CLI

def cli_page() -> str:
    from spacejobs.webapp.cli import main

    lines = [
        "# CLI",
        "",
        "`spacejobs` (`spacejobs.webapp.cli:main`). This page is written from the click commands when the",
        "site is built; `spacejobs COMMAND --help` says the same. Commands that create something",
        "print only the new id or token on stdout, so scripts can capture it.",
        "",
        "| command | what |",
        "|---|---|",
    ]
    commands = list(_walk(main, "spacejobs"))
    for path, command in commands[1:]:
        if not isinstance(command, click.Group):
            lines.append(f"| [`{path}`](#{_anchor(path)}) | {_cell(command.get_short_help_str(80))} |")
    for path, command in commands:
        if isinstance(command, click.Group) and path != "spacejobs":
            continue
        context = click.Context(command, info_name=path)
        lines += ["", f"## `{path}` {{ #{_anchor(path)} }}", "", "```", command.get_usage(context)
                  .removeprefix("Usage: "), "```", ""]
        if command.help:
            lines += [_paragraphs(command.help), ""]
        rows = [_param_row(param, context) for param in command.get_params(context)]
        rows = [row for row in rows if row]
        if rows:
            lines += ["| argument or option | type | default | meaning |", "|---|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


def _walk(command: click.Command, path: str):
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            yield from _walk(command.commands[name], f"{path} {name}")


def _param_row(param: click.Parameter, context: click.Context) -> str | None:
    if isinstance(param, click.Option) and "--help" in param.opts:
        return None
    if isinstance(param, click.Argument):
        names = f"`{param.human_readable_name}`"
        default = None
    else:
        names = ", ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
        default = param.get_default(context)
    if isinstance(param, click.Option) and param.is_flag:
        kind = "flag"
    elif isinstance(param.type, click.Choice):
        kind = " \\| ".join(f"`{choice}`" for choice in param.type.choices)
    else:
        kind = param.type.name
    # click 8.2+ stands for "no default" with a sentinel of its own
    unset = default is None or default is getattr(click.core, "UNSET", None) or default in (False, "", ())
    shown = "—" if unset else f"`{default}`"
    meaning = _cell(getattr(param, "help", None) or ("required" if param.required else ""))
    return f"| {names} | {kind} | {shown} | {meaning} |"


def _paragraphs(text: str) -> str:
    return "\n\n".join(" ".join(block.split()) for block in text.split("\n\n"))


def _anchor(path: str) -> str:
    return path.replace(" ", "-")
