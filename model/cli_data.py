"""``ccrk data``: make and inspect training data (the synthetic catalogue, translation pairs). Heavy imports
happen inside the commands so ``ccrk --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from model.cli_common import console, fail

if TYPE_CHECKING:
    from synthetic.synth import CatalogueSummary

data_app = typer.Typer(help="Make and inspect training data.", no_args_is_help=True)


@data_app.command("synth")
def data_synth(
    out: Annotated[Path, typer.Option(help="Output folder for the catalogue.")] = Path("data/synth"),
    seed: Annotated[int, typer.Option(help="Everything is deterministic from this seed.")] = 0,
    n_train: Annotated[int, typer.Option(help="Training images.")] = 20000,
    n_val: Annotated[int, typer.Option(help="Validation images.")] = 500,
    n_test: Annotated[int, typer.Option(help="Test images (each attribute combination unique).")] = 1000,
    image_size: Annotated[int, typer.Option(help="Rendered image size in pixels.")] = 96,
    captions_per_language: Annotated[int, typer.Option(help="Aligned phrasings per image and language.")] = 2,
    shop_titles: Annotated[
        str | None,
        typer.Option(
            help="Also a shop-style product title per item in this language (de), the field `title` that "
            "hybrid search reads (`ccrk index build --text-fields title`)."
        ),
    ] = None,
) -> None:
    """Generate the synthetic multilingual product catalogue (images + captions in ten languages)."""
    from tqdm.auto import tqdm

    from synthetic.synth import SynthConfig, generate_catalogue

    try:
        config = SynthConfig(
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            image_size=image_size,
            captions_per_language=captions_per_language,
            shop_titles=shop_titles,
        )
    except ValueError as exc:
        raise fail(str(exc)) from exc
    bar = tqdm(total=n_train + n_val + n_test, unit="img", desc="rendering")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        summary = generate_catalogue(out, config, progress=progress)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    finally:
        bar.close()
    console.print(describe_catalogue(summary), markup=False, highlight=False, soft_wrap=True)


def describe_catalogue(summary: CatalogueSummary) -> str:
    """What ``data synth`` wrote, in words (it printed the summary's dataclass repr)."""
    counts = ", ".join(f"{n:,} {split}" for split, n in summary.counts.items())
    files = ", ".join(path.name for path in summary.splits.values())
    return (
        f"catalogue written to {summary.out_dir} in {summary.seconds:.1f} s: {counts} images\n"
        f"  splits: {files}; images: {summary.images_dir}/; description: {summary.catalogue_json.name}"
    )


@data_app.command("pairs")
def pairs_command(
    data: Annotated[Path, typer.Option(help="A split jsonl, or a catalogue folder (uses train.jsonl).")],
    out: Annotated[Path, typer.Option(help="TSV of translation pairs to write.")],
    per_record: Annotated[int, typer.Option(min=1, help="Pairs drawn per catalogue record.")] = 4,
    seed: int = 0,
    source: Annotated[
        str | None, typer.Option(help="Only (SOURCE, TARGET) pairs, e.g. --source en --target ko.")
    ] = None,
    target: Annotated[str | None, typer.Option(help="With --source: the pairs' second language.")] = None,
    noise: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of the TARGET captions given a machine-translation-like error (wrong attribute "
            "word, agreement, dropped word, copied source word); logged per pair in OUT.noise.jsonl.",
        ),
    ] = 0.0,
    noise_seed: Annotated[int | None, typer.Option(help="Seed of the noise (default: --seed).")] = None,
    captions_out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the split with the same noisy TARGET captions (a catalogue jsonl for "
            "`ccrk model add-language --captions`, LE)."
        ),
    ] = None,
) -> None:
    """Translation pairs (one image's captions in two languages) for MURAL's text-text term
    (`ccrk train --translation-weight W --parallel-data OUT`), or, with --source/--target, (native, new)
    pairs for `ccrk model add-language --parallel OUT`, optionally with dialled translation noise."""
    from model.parallel_corpus import pairs_from_catalogue, write_pairs_tsv
    from synthetic.catalogue import CatalogueFormatError, load_split
    from synthetic.noise import NoiseError, corrupt_records, summarise, write_log, write_records

    if (source is None) != (target is None):
        raise fail("--source and --target go together")
    if (noise > 0 or captions_out is not None) and target is None:
        raise fail("--noise and --captions-out need --source and --target (the noisy side is TARGET)")
    split = data / "train.jsonl" if data.is_dir() else data
    if not split.is_file():
        raise fail(f"catalogue split not found: {split}")
    try:
        records = load_split(split)
        log = None
        if target is not None and source is not None and (noise > 0 or captions_out is not None):
            records, log = corrupt_records(
                records, target, source, noise, seed if noise_seed is None else noise_seed
            )
        pairs = pairs_from_catalogue(records, per_record, seed, source=source, target=target)
    except (CatalogueFormatError, NoiseError) as exc:
        raise fail(f"{split}: {exc}") from exc
    if len(pairs) < 2:
        needs = f"captions in {source!r} and {target!r}" if source else "captions in at least two languages"
        raise fail(f"{split} yields {len(pairs)} pairs: records need {needs}")
    write_pairs_tsv(pairs, out)
    console.print(f"wrote {len(pairs)} translation pairs to {out}", markup=False)
    if log is not None:
        # pairs_from_catalogue's order: records in order, slots 0.. of those with both languages.
        lines: dict[tuple[str, int], int] = {}
        for record in records:
            if source is not None and record.captions.get(source) and target and record.captions.get(target):
                slots = min(len(record.captions[source]), len(record.captions[target]), per_record)
                for j in range(slots):
                    lines[(record.id, j)] = len(lines) + 1
        in_pairs = [e for e in log if (e.id, e.slot) in lines]
        noise_log = out.with_name(out.name + ".noise.jsonl")
        write_log(in_pairs, noise_log, lines={(e.id, e.slot): lines[(e.id, e.slot)] for e in in_pairs})
        stats = summarise(in_pairs)
        console.print(
            f"noise: {stats['corrupted']} of {stats['slots']} pairs corrupted ({stats['rate']:.1%}), "
            f"{stats['kinds']}; per pair in {noise_log}"
        )
    if captions_out is not None:
        write_records(records, captions_out)
        console.print(f"wrote the split with noisy {target} captions to {captions_out}", markup=False)
