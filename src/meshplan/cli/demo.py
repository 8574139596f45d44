"""``meshplan demo``: the main job on an embedded default — plan GPT-3 175B on 1024 A100-80GB and explain the
choice, next to the layout Megatron-LM published for it.

Exit status: 0 when a plan fits, 4 when nothing fits (as ``meshplan plan``), 2 for user errors."""

from __future__ import annotations

import typer

# The embedded default: GPT-3 175B as Narayanan et al. 2021 trained it (Table 1 family: 1024 A100-80GB,
# global batch 1536, sequence 2048, fp16 -> bf16 here).
DEFAULT_MODEL = "gpt3-175b"
DEFAULT_GPUS = "1024xa100-80gb"
DEFAULT_BATCH = 1536
DEFAULT_SEQ = 2048


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command."""

    @app.command()
    def demo(
        model: str = typer.Option(DEFAULT_MODEL, "--model", help="Catalog model to plan."),
        gpus: str = typer.Option(DEFAULT_GPUS, "--gpus", help="Cluster shorthand."),
        global_batch: int = typer.Option(DEFAULT_BATCH, "--global-batch"),
        seq_len: int = typer.Option(DEFAULT_SEQ, "--seq-len"),
    ) -> None:
        """Plan a known model on a known cluster (no arguments needed) and explain the winner."""
        from meshplan import catalog
        from meshplan.cli.plan import NOTHING_FITS_EXIT
        from meshplan.report.search import render_text
        from meshplan.search import SearchRequest, search

        mdl, clu = catalog.model(model), catalog.cluster(gpus)
        request = SearchRequest(global_batch=global_batch, seq_len=seq_len)
        typer.echo(f"Planning {mdl.name} ({mdl.n_layers} layers) on {clu.describe()}: global batch "
                   f"{global_batch} x {seq_len} tokens, bf16, peak memory under "
                   f"{100 * request.max_memory_fraction:.0f} % of each GPU.\n")
        result = search(mdl, clu, request)
        typer.echo(render_text(result))
        if result.best is None:  # as meshplan plan: the breakdown above says what would fit
            raise typer.Exit(NOTHING_FITS_EXIT)
        typer.echo("Next: `meshplan plan ... --out plan.toml`, then `meshplan export plan.toml --to megatron`, "
                   "`meshplan report plan.toml -o report.html`, `meshplan validate "
                   "../shared/validation/runs_visible.csv`.")
