"""The one note on stored rows that failed their checksum (``indexer.report.mismatch_note``), as the main
rows' reuse (``indexer.incremental.report_reuse``) and the product channels' (``indexer.product_reuse``)
write it."""

from __future__ import annotations

import numpy as np

from indexer.incremental import ReusePlan, report_reuse
from indexer.product_reuse import ProductReuse, report_products
from indexer.report import BuildReport, mismatch_note


def test_the_note_names_ten_rows_and_says_there_are_more() -> None:
    names = [f"row {i}" for i in range(12)]
    assert mismatch_note("stored row(s)", "v1", names, "; ") == (
        "12 stored row(s) of v1 failed their checksum and were encoded again: "
        + "; ".join(names[:10])
        + " ..."
    )
    assert mismatch_note("stored row(s)", "v1", names[:2], ", ") == (
        "2 stored row(s) of v1 failed their checksum and were encoded again: row 0, row 1"
    )


def test_main_rows_and_product_channels_write_the_same_note() -> None:
    main = BuildReport("build", "shop", "v2", True)
    plan = ReusePlan(
        np.zeros((0, 16), np.uint8), np.zeros(0, np.int64), parent_version="v1", mismatched=["a", "b"]
    )
    report_reuse(main, plan, 0)
    assert main.notes == ["2 stored row(s) of v1 failed their checksum and were encoded again: 'a', 'b'"]
    products = BuildReport("build", "shop", "v2", True)
    report_products(products, ProductReuse(None, parent_version="v1", mismatched=["photo x", "text t of p"]))
    assert products.notes[-1] == (
        "2 stored product vector row(s) of v1 failed their checksum and were encoded again: "
        "photo x; text t of p"
    )
