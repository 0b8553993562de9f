"""Write one case's entry, derived from a bundle, into a baseline file."""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfkit.bundle import ResultBundle, steady_state
from perfkit.gate.baseline.derive import from_bundle, set_case
from perfkit.gate.baseline.files import load_baseline, new_baseline, save_baseline
from perfkit.gate.baseline.rules import DEFAULT_STEP_FRACTIONS

log = logging.getLogger(__name__)


def update_baseline(
    bundle_dir: str | Path,
    baseline_file: str | Path,
    case_id: str,
    *,
    hardware: str | None = None,
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
    launch: str | None = None,
    num_frames: int | None = None,
) -> dict[str, Any]:
    """Write ``case_id``'s entry, derived from the bundle at ``bundle_dir``, into ``baseline_file``
    (atomically, :func:`save_baseline`; created with ``tolerances``, default sglang's, when
    missing) and return the document. The entry is the steady state the suite's gate writes
    (:func:`perfkit.bundle.steady_state` of ``launch``; ``num_frames`` picks one request shape).
    Other cases, tolerances and unknown keys are kept; ``metadata`` gets today's date, the bundle's
    git commit and ``hardware`` when given.

    Raises:
        ValueError: a case id that is empty, longer than 200 characters or not printable; several
            launches and no ``launch``; an unknown launch; ``hardware`` differs
            from the file's ``metadata.hardware`` (a baseline holds one hardware's numbers).
    """
    if not case_id or len(case_id) > 200 or not case_id.isprintable():
        raise ValueError(f"case id {case_id[:60]!r}: 1 to 200 printable characters")
    bundle = ResultBundle.load(bundle_dir)
    launches = [str(x) for x in bundle.launches.get("launch", [])] if not bundle.launches.empty else []
    if launch is None and len(launches) > 1:
        raise ValueError(
            f"{bundle_dir} holds {len(launches)} launches ({', '.join(launches)}): name one with --launch"
        )
    if launch is not None and launches and launch not in launches:
        raise ValueError(f"{bundle_dir}: no launch {launch!r} (has {', '.join(launches)})")
    sel = steady_state(bundle, launch=launch, num_frames=num_frames)
    path = Path(baseline_file)
    if path.exists():
        doc = load_baseline(path)
        have = (doc.get("metadata") or {}).get("hardware")
        if hardware is not None and have and have != hardware:
            raise ValueError(
                f"{path} holds numbers for hardware {have!r}, not {hardware!r}: "
                f"write another hardware's numbers to its own baseline file"
            )
    else:
        log.info("creating baseline %s", path)
        doc = new_baseline(hardware, tolerances=tolerances)
    fractions = (doc.get("sampling") or {}).get("step_fractions") or DEFAULT_STEP_FRACTIONS
    entry = from_bundle(sel, case_id, fractions)
    set_case(doc, case_id, entry)
    meta = doc.setdefault("metadata", {})
    commit = bundle.meta.get("git_commit") or "unknown"
    meta["description"] = (
        f"Reference numbers for {case_id} from perfkit bundle "
        f"{Path(bundle_dir).name} ({bundle.investigation}) at git commit {commit}."
    )
    meta["last_updated"] = _dt.date.today().isoformat()
    if hardware is not None:
        meta["hardware"] = hardware
    save_baseline(doc, path)
    log.info("baseline %s: case %s updated from %s", path, case_id, bundle_dir)
    return doc
