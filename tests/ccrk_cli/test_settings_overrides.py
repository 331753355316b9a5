"""Command-line options override settings through one validating helper (``ccrk_settings.settings_with``):
a value the Settings model rejects stops the command with a message naming the option (or the CCRK_
variable), whichever CLI took it."""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from ccrk_cli.main import app
from ccrk_settings import Settings, SettingsError, get_settings, settings_with

runner = CliRunner()


@pytest.fixture
def clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No CCRK_ variable or .env file of the machine running the tests; a fresh get_settings()."""
    for key in [k for k in os.environ if k.startswith("CCRK_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _types(annotation: object) -> tuple[object, ...]:
    """``float | None`` as (float, NoneType); a plain type as itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def output(result: object) -> str:
    """The CLI output on one line (rich and click wrap long messages)."""
    return " ".join(result.output.replace("│", " ").split())  # type: ignore[attr-defined]


@pytest.mark.usefixtures("clean_settings")
def test_overrides_apply_and_none_keeps_the_configured_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCRK_THREADS", "3")
    monkeypatch.setenv("CCRK_INDEX_NAME", "from-env")
    base = get_settings()
    settings = settings_with({"threads": None, "index_name": "shop", "index_root": Path("/srv/idx")})
    assert (settings.threads, settings.index_name, settings.index_root) == (3, "shop", Path("/srv/idx"))
    assert (base.index_name, base.index_root) == ("from-env", Path("artifacts/indexes"))  # not changed


@pytest.mark.usefixtures("clean_settings")
def test_an_invalid_override_names_the_field() -> None:
    with pytest.raises(SettingsError) as caught:
        settings_with({"threads": 300, "backend": "tensorflow", "port": None})
    by_field = {p.field: p for p in caught.value.problems}
    assert set(by_field) == {"threads", "backend"}
    assert by_field["threads"].value == 300 and by_field["threads"].from_override
    assert caught.value.describe({"threads": "-t"}).splitlines() == [
        "--backend: Input should be 'onnx' or 'torch' (got 'tensorflow')",
        "-t: Input should be less than or equal to 256 (got '300')",
    ]


@pytest.mark.usefixtures("clean_settings")
def test_an_invalid_environment_value_is_named_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCRK_PROBE_DEPTH", "5")
    with pytest.raises(SettingsError) as caught:
        settings_with({"index_name": "shop"})
    assert str(caught.value) == "CCRK_PROBE_DEPTH: Input should be greater than or equal to 10 (got '5')"


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "auto"), ("auto", "auto"), ("on", "on"), ("off", "off"), ("true", "on"), ("False", "off"),
     ("1", "on"), ("0", "off")],
)  # fmt: skip
def test_index_gpu_is_auto_by_default_and_takes_the_old_booleans(
    monkeypatch: pytest.MonkeyPatch, value: str | None, mode: str
) -> None:
    if value is not None:
        monkeypatch.setenv("CCRK_INDEX_GPU", value)
    assert get_settings().index_gpu == mode
    assert Settings(index_gpu=mode == "on").index_gpu == ("on" if mode == "on" else "off")


@pytest.mark.usefixtures("clean_settings")
def test_index_gpu_refuses_another_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCRK_INDEX_GPU", "maybe")
    with pytest.raises(SettingsError) as caught:
        settings_with({})
    assert str(caught.value) == "CCRK_INDEX_GPU: Input should be 'auto', 'on' or 'off' (got 'maybe')"


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_index_poll_interval_that_is_not_finite_is_named(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``index_poll_s`` (> 0) took inf, and the admin route's Retry-After, its ceiling, then raised
    OverflowError: a 500."""
    monkeypatch.setenv("CCRK_INDEX_POLL_S", value)
    with pytest.raises(SettingsError, match="CCRK_INDEX_POLL_S"):
        settings_with({"index_name": "shop"})


FLOAT_SETTINGS = [name for name, field in Settings.model_fields.items() if float in _types(field.annotation)]


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_no_float_setting_takes_a_number_that_is_not_finite(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Only index_poll_s refused inf: CCRK_HTTP_HEADER_TIMEOUT_S=inf, CCRK_REDIS_TIMEOUT_S=inf,
    CCRK_KEY_RATE=inf... loaded, and broke timeouts and rates at run time, far from the cause."""
    assert len(FLOAT_SETTINGS) >= 30  # the annotation check still finds them (float, float | None)
    variable = f"CCRK_{name.upper()}"
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        settings_with({"index_name": "shop"})
    assert str(caught.value).startswith(f"{variable}: "), str(caught.value)


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize("args", [["config", "show"], ["serve"], ["probe", "run", "--no-store"]])
def test_each_cli_names_a_variable_that_is_not_finite(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    monkeypatch.setenv("CCRK_HTTP_HEADER_TIMEOUT_S", "inf")
    # No model there: were the setting let through, `serve` would stop on that instead of serving.
    monkeypatch.setenv("CCRK_MODEL_DIR", str(tmp_path / "no-model"))
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "CCRK_HTTP_HEADER_TIMEOUT_S" in output(result) and "finite" in output(result)


def test_a_name_that_is_no_setting_is_a_type_error() -> None:
    """The model ignores unknown keys, so a caller's misspelt override would otherwise vanish."""
    with pytest.raises(TypeError, match="index_nmae"):
        settings_with({"index_nmae": "shop"})


def test_secrets_are_not_echoed() -> None:
    error = SettingsError.from_validation(
        ValidationError.from_exception_data(
            "Settings", [{"type": "missing", "loc": ("admin_api_key",), "input": "s3cret"}]
        ),
        overrides={"admin_api_key": "s3cret"},
    )
    assert str(error) == "--admin-api-key: Field required (got '****')"


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Validated before as well (twice over), now through the shared helper.
        (
            ["serve", "--backend", "tensorflow"],
            "--backend: Input should be 'onnx' or 'torch' (got 'tensorflow')",
        ),
        # The indexer copied overrides in unvalidated: --threads 300 reached the encoder runtime.
        (["index", "build", "--threads", "300"], "--threads: Input should be less than or equal to 256"),
        (["index", "add", "--threads", "300"], "--threads: Input should be less than or equal to 256"),
        (["index", "build", "--rerank-dtype", "fp8"], "--rerank-dtype: Input should be 'fp16' or 'int8'"),
    ],
)
def test_each_cli_refuses_an_invalid_option_naming_it(tmp_path: Path, args: list[str], message: str) -> None:
    if args[0] == "index":
        args = [*args[:2], "--name", "shop", "--index-root", str(tmp_path / "idx"), *args[2:], str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in output(result)
    assert not (tmp_path / "idx").exists()  # refused before any work


@pytest.mark.usefixtures("clean_settings")
def test_probe_run_names_an_invalid_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ccrk probe run` copied overrides in unvalidated too; its options (paths, a name) take any value,
    so its settings are checked here through the environment: a clear error, not a traceback."""
    monkeypatch.setenv("CCRK_PROBE_DEPTH", "5")
    result = runner.invoke(app, ["probe", "run", "--probe-set", str(tmp_path / "probes.jsonl"), "--no-store"])
    assert result.exit_code == 2, result.output
    assert "CCRK_PROBE_DEPTH: Input should be greater than or equal to 10 (got '5')" in output(result)


def test_a_bad_environment_value_is_blamed_on_the_variable_even_with_the_option_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ccrk_settings import SettingsError, get_settings, settings_with

    monkeypatch.setenv("CCRK_THREADS", "abc")
    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError) as caught:
            settings_with({"threads": 4})
    finally:
        get_settings.cache_clear()
    assert caught.value.describe().startswith("CCRK_THREADS: ")


@pytest.mark.usefixtures("clean_settings")
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CCRK_PAGE_CURRENCY", "euro"),
        ("CCRK_PAGE_CURRENCY", "eur"),
        ("CCRK_PAGE_PRICE_FIELD", "price; drop"),
        ("CCRK_PAGE_FACETS", "brand,no such field"),
    ],
)
def test_the_search_pages_display_settings_refuse_what_the_page_cannot_show(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """The page formats prices with Intl.NumberFormat (an ISO 4217 code) and asks for facets by field name:
    anything else is refused at start, naming the variable, not at the first search."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        settings_with({"index_name": "shop"})
    assert str(caught.value).startswith(f"{variable}: "), str(caught.value)


def test_the_pages_field_rule_is_the_search_apis() -> None:
    """CCRK_PAGE_FACETS and CCRK_PAGE_PRICE_FIELD take exactly the names a search request takes."""
    import re

    from pydantic import TypeAdapter

    from ccrk_settings import REQUEST_FIELD
    from service.schemas import FieldName

    api = TypeAdapter(FieldName)
    for name in [
        "brand",
        "price.eur",
        "_x",
        "a-b",
        "9lives",
        "with space",
        "title@de",
        "x" * 64,
        "x" * 65,
        "",
    ]:
        try:
            api.validate_python(name)
            taken = True
        except ValueError:
            taken = False
        assert taken == bool(re.fullmatch(REQUEST_FIELD, name)), name
