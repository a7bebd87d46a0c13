"""Proton Fig. 12: Gluon attention's intra-kernel cycle profile (Blackwell only; elsewhere planned rows)."""
from __future__ import annotations

from harness.figures import table


@table("Gluon attention points and why they did not run here", experiment="proton_fig12")
def status(df):
    d = df.drop_duplicates("point_hash")
    return d[["gpu", "workload", "impl", "batch", "seq_len", "weight_dtype", "params", "status", "error"]]
