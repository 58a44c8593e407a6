"""Law claims decided from a saved fit: the `[[laws]]` rules of an experiment definition.

A claim that the loss follows a law is stated as a `[[laws]]` table (fields: `synthlab.claims.rules.LawRule`)
and decided from the fit `synthlab fit ... --save` wrote beside the results table (`decide_law`):

    [[laws]]
    claim = "C5"
    says = "the LoopLM law fits the held-out loss and predicts the largest size from the smaller ones"
    fit = "fit_looplm.json"              # `synthlab fit looplm results.csv --holdout size --save ...`
    min_r2 = 0.9                         # in-sample R^2 (loss space)
    min_holdout_r2 = 0.8                 # every identified hold-out split's test R^2
    holdout = "size"                     # the hold-out the fit must carry ("" for none)

- a degenerate fit decides nothing: one that did not converge, or has a constant infinite or
  implausible (`scaling.implausible`: what `synthlab fit` prints as "degenerate fit"), sits at a
  boundary of its parameter space, so neither its constants nor a lack-of-fit test against them
  say anything about the law (the test is reported beside); it makes the rule "not identified";
- "contradicted" if a converged, plausible fit's lack-of-fit test (`scaling.lack_of_fit`: the
  law's best least-squares fit against the scatter of replicated design points, i.e. seeds; its p
  over runs where the fit has one, else the F test's) rejects the law's form at
  `lack_of_fit_level` (default 0.05; 0 turns it off; the step-wise law's k fits each at level / k,
  so that together they keep the level): no constants of the law fit these data within seed noise;
- "not identified": the bootstrap gave no interval (fewer than 90% of refits converged, or none
  were run), or every hold-out split left too few levels to fit on: the data cannot decide the law
  either way;
- "reproduced": identified, R^2 >= min_r2 and every identified hold-out's test R^2 >= min_holdout_r2;
- "contradicted": identified, but one of them falls short;
- "no data": no saved fit, or one of other numbers than the table holds now (its digest differs).
For the step-wise law (one fit per Tm) every Tm's fit must pass.
"""

from __future__ import annotations

import math

from synthlab.claims.rules import LawRule
from synthlab.claims.verdicts import Verdict


def _why_no_data(rule: LawRule, saved: dict | None, digest_now: str | None) -> str:
    """Why the saved fit cannot decide the rule ('' when it can)."""
    if saved is None:
        return f"no {rule.fit}: run `synthlab fit ... --save`"
    if digest_now != saved.get("data_sha256"):
        return f"{rule.fit} is a fit of other numbers than {rule.table} holds now: rerun its command"
    if (saved.get("holdout_kind") or "") != rule.holdout:
        return f"{rule.fit} has hold-out {saved.get('holdout_kind') or 'none'}, the rule needs {rule.holdout or 'none'}"
    return ""


def decide_law(rule: LawRule, saved: dict | None, digest_now: str | None) -> Verdict:
    """The outcome of `rule` from a saved fit (None: no file) and the digest of the numbers the
    table holds now (None: the table cannot be read with the fit's columns)."""
    missing = _why_no_data(rule, saved, digest_now)
    if missing:
        return Verdict(rule, "no data", math.nan, math.nan, math.nan, 0, missing)
    fits = saved.get("fits", [saved])
    level = rule.lack_of_fit_level / len(fits)  # Bonferroni: the step-wise law's fits (one per Tm) together
    rejected, unidentified, short, said = {}, {}, {}, {}  # per fit (Tm for the step-wise law): what decided it
    for part in fits:
        name = f"Tm = {part['Tm']:g}" if "Tm" in part else ""
        lof = part.get("lack_of_fit")
        p = (lof["p_runs"] if lof.get("resamples") else lof["p"]) if lof else math.nan
        form = (
            [
                f"lack of fit F = {lof['f']:.3g}, p = {p:.2g}" + (" over runs" if lof.get("resamples") else ""),
                f"R^2 ceiling {lof['r2_ceiling']:.3f}",
            ]
            if lof
            else []
        )
        problems = degenerate(part)
        rejected[name] = form[:1] if lof and p < level and not problems else []
        if not part.get("bootstrap"):
            problems.append("no bootstrap")
        elif part.get("bootstrap_refused"):
            problems.append(f"{part['bootstrap_converged']} of {part['bootstrap']} refits converged")
        held = [h for h in part.get("holdout", []) if not h.get("thin")]
        if rule.holdout and not held:
            problems.append("every hold-out split leaves too few levels")
        facts = [f"R^2 {part['r2']:.3f}", *form] + [f"{h['split']}: test R^2 {h['r2_test']:.3f}" for h in held]
        fails = [f"R^2 {part['r2']:.3f} < {rule.min_r2:g}"] if part["r2"] < rule.min_r2 else []
        fails += [
            f"{h['split']}: test R^2 {h['r2_test']:.3f} < {rule.min_holdout_r2:g}"
            for h in held
            if h["r2_test"] < rule.min_holdout_r2
        ]
        unidentified[name], short[name], said[name] = problems, fails, facts
    n = sum(int(part["n_rows"]) for part in fits)
    estimate = min(part["r2"] for part in fits)
    if any(rejected.values()):
        found = {
            k: [f"the law's form departs from the data beyond seed noise ({', '.join(v)} < {level:.2g})"] if v else []
            for k, v in rejected.items()
        }
        return Verdict(rule, "contradicted", estimate, math.nan, math.nan, n, _per_fit(found))
    if any(unidentified.values()):
        found = {k: unidentified[k] + said[k] for k in said}
        return Verdict(rule, "not identified", estimate, math.nan, math.nan, n, _per_fit(found))
    failed = any(short.values())
    return Verdict(
        rule,
        "contradicted" if failed else "reproduced",
        estimate,
        math.nan,
        math.nan,
        n,
        _per_fit(short if failed else said),
    )


def degenerate(part: dict) -> list[str]:
    """Why a saved fit sits at a boundary (not converged, a constant infinite or implausible; the
    saved record writes an infinity as the string "inf"), or [] for a converged, plausible one."""
    problems = [] if part["converged"] else ["not converged"]
    flagged = list(part.get("implausible", []))
    flagged += [k for k, v in part.items() if isinstance(v, str) and v in ("inf", "-inf", "nan") and k not in flagged]
    return problems + [f"{k} = {float(part[k]):.3g}" if k in part else k for k in flagged]


def _per_fit(found: dict[str, list[str]]) -> str:
    """'Tm = 2: a, b; Tm = 3: c' (a fit without a name: 'a, b'), fits with nothing to say left out."""
    return "; ".join(
        f"{name}: {', '.join(items)}" if name else ", ".join(items) for name, items in found.items() if items
    )
