"""The documentation's generated pages, written from the live objects so that they cannot drift from them:
the ``ccrk`` commands from the typer app, every setting from the ``Settings`` class (through
``ccrk_settings.reference``, the same generator as ``deploy/CONFIGURATION.md``), the HTTP API from the
service's OpenAPI schema, and the list of recorded benchmark results from ``bench/results/``.

The mkdocs hook (``docs/gen/hooks.py``) adds these pages to every build (``make docs``, ``mkdocs build
--strict``, ``mkdocs serve``) without writing them into ``docs/``; ``python docs/gen/reference.py OUT``
writes them into a folder, to read them without building the site. A new command, option, setting or route
appears in the docs at the next build, with nothing edited by hand.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# Where each generated page goes in the site (paths relative to docs/).
CLI_PAGE = "reference/cli.md"
SETTINGS_PAGE = "reference/settings.md"
HTTP_PAGE = "reference/http-api.md"
OPENAPI_FILE = "reference/openapi.json"
RESULTS_PAGE = "benchmarks/results.md"
# The model cards live beside the models (model/cards/NAME.md); the site shows them as they are.
CARDS_DIR = REPO / "model" / "cards"
# The operations guide beside the deployment files, shown in the site with its links to those files made
# plain paths (they are files of the repository, not pages).
DEPLOY_GUIDE = REPO / "deploy" / "README.md"
DEPLOY_GUIDE_PAGE = "how-to/deploy-guide.md"

# The command behind each recorded result whose JSON does not record it itself (older runs): as the README
# gave it, or, marked so, rebuilt from the parameters the file records. A results file matching none of
# these and recording no command fails the docs test.
REBUILT = " (not recorded: rebuilt from the parameters in the file)"
RESULT_COMMANDS = {
    "cluster_scaling-": "python bench/cluster_scaling.py",
    "encoders-ccrk-demo-": "python bench/encoders.py --model model/pretrained/ccrk-demo",
    "encoders-ccrk-paper-": (
        "python bench/encoders.py --preset ccrk-paper --backends torch,onnx,onnx-int8 --calls 100"
    ),
    "fault_under_load-": "sudo python bench/fault_under_load.py",
    "index_throughput-": "python bench/index_throughput.py",
    "live-crash-2026-12-03": (
        "python bench/live_crash.py --writes 10000 --out bench/results/live-crash-2026-12-03.json"
    ),
    "kcl_vs_one2one-2026-11-21": (
        "ccrk data synth --out data/synth --seed 0 && ccrk experiment kcl-vs-one2one --data data/synth "
        "--seeds 0,1,2 --epochs 4 --train-limit 2000 --batch-size 32"
    ),
    "kcl_vs_one2one-converged-config": (
        "(the model of the converged kcl-vs-one2one run: "
        "--preset bench/results/kcl_vs_one2one-converged-config.json)"
    ),
    "language_id-": "python bench/language_id.py",
    "match_quality-": "python bench/match_quality.py",
    "search_load-1process-": "python bench/search_load.py --items 100000 --items 1000000 --processes 1"
    + REBUILT,
    "search_load-open400-1M-": (
        "python bench/search_load.py --items 1000000 --processes 2 (10 open-loop runs at 400 q/s)" + REBUILT
    ),
    "search_load-open-": (
        "python bench/search_load.py --items 100000 --items 1000000 --processes 2 (open loop, 200-500 q/s)"
        + REBUILT
    ),
    "search_load-2026": (
        "python bench/search_load.py --items 100000 --items 1000000 --processes 2 --open-repeat 5"
    ),
    "starter_real_photos-": "python bench/starter_real_photos.py",
    "upload_memory-": "python bench/upload_memory.py",
}


# ---------------------------------------------------------------------------------------------------- CLI


def cli_commands() -> list[tuple[str, Any]]:
    """(``ccrk sub command``, click command) for the app and every command under it, depth first."""
    import typer

    from ccrk_cli.main import app

    root = typer.main.get_command(app)

    def walk(name: str, command: Any) -> Iterator[tuple[str, Any]]:
        yield name, command
        for sub_name, sub in getattr(command, "commands", {}).items():
            yield from walk(f"{name} {sub_name}", sub)

    return list(walk("ccrk", root))


def cli_markdown(app: Any = None) -> str:
    """Every command of ``app`` (default: the ``ccrk`` app) with its usage, arguments and options, as
    typer's own docs generator writes them (``typer ... utils docs``)."""
    import click
    import typer
    from typer.cli import get_docs_for_click

    if app is None:
        from ccrk_cli.main import app

    root = typer.main.get_command(app)
    body = get_docs_for_click(obj=root, ctx=click.Context(root), name="ccrk")
    # typer's page starts with the app as its title: this page has its own.
    body = body.replace("# `ccrk`", "## `ccrk`", 1)
    header = (
        "# CLI reference\n\n"
        "Every `ccrk` command and option, generated from the typer app itself (`ccrk_cli.main.app`) at each "
        "build of these pages: `ccrk COMMAND --help` prints the same. Settings (`CCRK_*` variables) give "
        "most options their defaults: see [Settings](settings.md).\n\n"
    )
    return header + body


# ------------------------------------------------------------------------------------------------ settings


def settings_markdown() -> str:
    from ccrk_settings.reference import markdown_reference

    text = markdown_reference()
    return text.replace(
        "# Configuration reference",
        "# Settings\n\n*Also in the repository as `deploy/CONFIGURATION.md` (the same generator).*",
        1,
    )


# ----------------------------------------------------------------------------------------------- HTTP API


def openapi_schema() -> dict[str, Any]:
    """The service's OpenAPI schema, from an app that loads nothing (the model and index load at startup)."""
    from service.app import create_app

    return create_app().openapi()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return f"schema-{name.lower()}"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema:
        kinds = [_type(s) for s in schema["anyOf"] if s.get("type") != "null"]
        optional = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if optional else "")
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if (
        kind == "object"
        and "additionalProperties" in schema
        and isinstance(schema["additionalProperties"], dict)
    ):
        return f"object of {_type(schema['additionalProperties'])}"
    if kind == "object" and "patternProperties" in schema:
        (value,) = schema["patternProperties"].values()
        return f"object of {_type(value)}"
    return str(kind) + (f" ({schema['format']})" if "format" in schema else "")


def _bounds(schema: dict[str, Any]) -> str:
    words = {
        "minimum": "≥",
        "maximum": "≤",
        "exclusiveMinimum": ">",
        "exclusiveMaximum": "<",
        "minLength": "length ≥",
        "maxLength": "length ≤",
        "minItems": "items ≥",
        "maxItems": "items ≤",
        "maxProperties": "fields ≤",
    }
    parts = []
    for candidate in [schema, *schema.get("anyOf", [])]:
        for key, word in words.items():
            if key in candidate:
                value = candidate[key]
                value = int(value) if isinstance(value, float) and value.is_integer() else value
                parts.append(f"{word} {value}")
    return ", ".join(dict.fromkeys(parts))


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _schema_table(schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    if not properties:
        return [f"Type: {_type(schema)}."]
    required = set(schema.get("required", []))
    lines = [
        "| field | type | required | default | limits | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, prop in properties.items():
        default = f"`{json.dumps(prop['default'], ensure_ascii=False)}`" if "default" in prop else ""
        lines.append(
            f"| `{name}` | {_cell(_type(prop))} | {'yes' if name in required else ''} | {_cell(default)} "
            f"| {_cell(_bounds(prop))} | {_cell(prop.get('description', ''))} |"
        )
    return lines


def _body_schema(operation: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    content = operation.get("requestBody", {}).get("content", {})
    for media, spec in content.items():
        return media, spec.get("schema", {})
    return None


def http_operations(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the schema, in its order."""
    return [(method.upper(), path) for path, item in schema["paths"].items() for method in item]


def http_markdown(schema: dict[str, Any] | None = None) -> str:
    schema = schema or openapi_schema()
    components = schema.get("components", {}).get("schemas", {})
    info = schema["info"]
    lines = [
        "# HTTP API",
        "",
        f"{info.get('summary', info['title'])} Version {info['version']}.",
        "",
        "Generated from the service's OpenAPI schema (`service.app.create_app().openapi()`) at each build of "
        "these pages; the schema itself is [openapi.json](openapi.json), and a running service serves it "
        "at `/openapi.json` with Swagger UI at `/docs` and ReDoc at `/redoc`. Errors are JSON "
        '`{"detail": ...}`: 422 names the field, and no request body causes a 5xx.',
        "",
        "| method | path | what |",
        "| --- | --- | --- |",
    ]
    for method, path in http_operations(schema):
        op = schema["paths"][path][method.lower()]
        anchor = op.get("operationId", "").replace("_", "-")
        what = op.get("description", "").split(". ")[0].rstrip(".") or op.get("summary", "")
        lines.append(f"| {method} | [`{path}`](#{anchor}) | {_cell(what)} |")
    for method, path in http_operations(schema):
        op = schema["paths"][path][method.lower()]
        anchor = op.get("operationId", "").replace("_", "-")
        lines += ["", f"## `{method} {path}` {{ #{anchor} }}", ""]
        if op.get("description"):
            lines += [op["description"], ""]
        params = op.get("parameters", [])
        if params:
            lines += [
                "| parameter | in | type | required | limits | meaning |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for p in params:
                s = p.get("schema", {})
                lines.append(
                    f"| `{p['name']}` | {p['in']} | {_cell(_type(s))} | {'yes' if p.get('required') else ''} "
                    f"| {_cell(_bounds(s))} | {_cell(p.get('description', s.get('description', '')))} |"
                )
            lines.append("")
        body = _body_schema(op)
        if body is not None:
            media, body_schema = body
            target = (
                components.get(_ref_name(body_schema["$ref"]), {}) if "$ref" in body_schema else body_schema
            )
            lines += [f"Request body (`{media}`): {_type(body_schema)}", ""]
            lines += [*_schema_table(target), ""]
        lines += ["| status | meaning |", "| --- | --- |"]
        for status, response in op.get("responses", {}).items():
            body_type = ""
            for spec in response.get("content", {}).values():
                if spec.get("schema"):
                    body_type = f": {_type(spec['schema'])}"
                break
            lines.append(f"| {status} | {_cell(response.get('description', ''))}{_cell(body_type)} |")
    if components:
        lines += ["", "## Schemas"]
        for name, component in components.items():
            lines += ["", f"### {name} {{ #{_anchor(name)} }}", ""]
            if component.get("description"):
                lines += [_cell(component["description"]), ""]
            lines += _schema_table(component)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- benchmarks


def result_files() -> list[Path]:
    return sorted((REPO / "bench" / "results").glob("*.json"))


def result_command(path: Path) -> str | None:
    """The command behind a results file: recorded in it, else from ``RESULT_COMMANDS``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        for key in ("command", "commands"):
            if key in data:
                value = data[key]
                if isinstance(value, list):
                    return " && ".join(str(v) for v in value)
                if isinstance(value, dict):
                    return "; ".join(f"{k}: {v}" for k, v in value.items())
                return str(value)
    for prefix, command in RESULT_COMMANDS.items():
        if path.name.startswith(prefix):
            return command
    return None


def results_markdown() -> str:
    lines = [
        "# Recorded results",
        "",
        "Every file in `bench/results/`, generated from the folder at each build of these pages, with the "
        "command behind it (recorded in the file where it says so). The [benchmarks page](index.md) "
        "explains the figures.",
        "",
        "| file | size | command |",
        "| --- | --- | --- |",
    ]
    for path in result_files():
        command = result_command(path) or "*(not recorded)*"
        size = f"{path.stat().st_size / 1024:.1f} KiB"
        lines.append(f"| `bench/results/{path.name}` | {size} | `{_cell(command)}` |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------- repository pages

LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)\)")


def deploy_guide_markdown() -> str:
    """``deploy/README.md`` with its links to repository files turned into their paths from the root."""

    def plain(match: re.Match[str]) -> str:
        text, target = match.groups()
        if target.startswith(("http://", "https://")):
            return match.group(0)
        if target == "CONFIGURATION.md":
            return f"[{text}](../reference/settings.md)"
        if target.startswith("../docs/"):  # a page of this site: the guide's page is how-to/deploy-guide.md
            return f"[{text}](../{target.removeprefix('../docs/')})"
        path = (Path("deploy") / target).as_posix()
        path = str(Path(os.path.normpath(path)).as_posix()) + ("/" if target.endswith("/") else "")
        return f"`{path}`" if text.strip("`") != path else text

    text = DEPLOY_GUIDE.read_text(encoding="utf-8")
    note = "*This page is `deploy/README.md`, the guide kept beside the deployment files.*\n\n"
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{note}{LINK.sub(plain, rest)}"


# ------------------------------------------------------------------------------------------- index format

FIELD_LINE = re.compile(r"^    (?P<name>\w+): (?P<type>[^=#]+?)\s*(?:=[^#]*)?(?:#\s*(?P<note>.*))?$")


def manifest_fields_markdown() -> str:
    """The fields of a version's ``manifest.json``: the ``store.version.manifest.IndexManifest`` dataclass,
    with the
    comments its source gives them (on the line, or on the lines just above)."""
    import dataclasses
    import inspect

    from store.version.manifest import IndexManifest

    notes: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(IndexManifest).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = FIELD_LINE.match(line)
        if match:
            notes[match["name"]] = " ".join([*above, match["note"] or ""]).strip()
        above = []
    lines = ["| field | type | note |", "| --- | --- | --- |"]
    for f in dataclasses.fields(IndexManifest):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        lines.append(f"| `{f.name}` | `{_cell(kind)}` | {_cell(notes.get(f.name, ''))} |")
    return "\n".join(lines) + "\n"


# Markers a written page may hold (``<!-- generated: NAME -->`` on a line of its own), replaced at build
# time by the hook with the named generator's output.
MARKERS = {"manifest-fields": manifest_fields_markdown}
MARKER = re.compile(r"^<!-- generated: (?P<name>[\w-]+) -->$", re.M)


def fill_markers(markdown: str) -> str:
    return MARKER.sub(lambda m: MARKERS[m["name"]]().rstrip("\n"), markdown)


# ------------------------------------------------------------------------------------------------ the lot


def generated_pages() -> dict[str, str]:
    """Path in the site (relative to docs/) -> content, for every generated page."""
    schema = openapi_schema()
    return {
        CLI_PAGE: cli_markdown(),
        SETTINGS_PAGE: settings_markdown(),
        HTTP_PAGE: http_markdown(schema),
        OPENAPI_FILE: json.dumps(schema, indent=2, ensure_ascii=False) + "\n",
        RESULTS_PAGE: results_markdown(),
        DEPLOY_GUIDE_PAGE: deploy_guide_markdown(),
        **{
            f"models/{card.name}": card.read_text(encoding="utf-8") for card in sorted(CARDS_DIR.glob("*.md"))
        },
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/gen/reference.py OUT_DIR   (writes the generated pages there)")
        return 2
    out = Path(argv[0])
    for rel, text in generated_pages().items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
        print(out / rel)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main(sys.argv[1:]))
