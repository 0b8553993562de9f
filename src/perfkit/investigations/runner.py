"""Run a registered investigation, or replay its recorded bundle (:func:`load_or_run`): what every
investigation notebook calls. Launch directories (engine logs, perf logs, compile caches) go to
``out/launches/``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import registry
from perfkit.investigations.registry import RunContext

log = logging.getLogger(__name__)


def shared_bundles(out: Path, name: str) -> dict[str, ResultBundle]:
    """Bundles that investigations registered before ``name`` already wrote beside ``out`` in this run
    (``out.parent/<investigation>/``); a later investigation may reuse their launch."""
    found: dict[str, ResultBundle] = {}
    for other in registry.names():
        if other == name:
            break
        d = out.parent / other
        if (d / "meta.json").exists():
            try:
                found[other] = ResultBundle.load(d)
            except (OSError, ValueError) as exc:
                log.warning("%s bundle not reusable: %s", other, exc)
    return found


def load_or_run(
    investigation: str,
    *,
    out: str | Path,
    bundle_dir: str | Path | None = None,
    engine: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
    share_launches: bool = True,
    **section: Any,
) -> ResultBundle:
    """Replay ``bundle_dir`` (launches nothing) or run ``investigation``; the bundle lands in ``out``.

    Args:
        out: the bundle's directory (``RUN/<investigation>``).
        bundle_dir: a recorded bundle to replay instead of launching anything.
        engine: EngineSpec fields; request: VideoRequestSpec fields (sglang's names).
        share_launches: reuse a launch that an earlier investigation of this run already measured
            when it ran exactly what this one would launch.
        section: the investigation's params (its params model validates them; ``enabled`` ignored).

    Raises:
        KeyError: unknown investigation. ValueError: invalid params (pydantic's ValidationError, naming
            the field), or ``bundle_dir`` holds another investigation's bundle.
        InvestigationError: the bundle holds no usable measurement (the notebook fails, exit 2).
    """
    s = registry.get(investigation)
    out = Path(out)
    if bundle_dir:
        b = ResultBundle.load(bundle_dir)
        if b.investigation != investigation:
            raise ValueError(
                f"bundle_dir {bundle_dir} holds a {b.investigation!r} bundle, expected {investigation!r}"
            )
        if Path(bundle_dir).resolve() != out.resolve():
            b.save(out)
        log.info("replaying %s bundle from %s", investigation, bundle_dir)
        s.check_bundle(b)
        return b
    # a notebook's bind cell already validated the section (its messages name each parameter)
    params = s.params_model.model_validate({k: v for k, v in section.items() if k != "enabled"})
    out.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(
        engine=EngineSpec.from_dict(dict(engine or {})),
        request=VideoRequestSpec.from_dict(dict(request or {})),
        work_dir=out / "launches",
        shared=shared_bundles(out, investigation) if share_launches else {},
    )
    b = s.run(ctx, params)
    b.save(out)
    s.check_bundle(b)  # after saving: the bundle (engine logs) is there to look at
    return b
