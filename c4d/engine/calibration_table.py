"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (21, 21),
    "RankCommHang:p2p-pair/link": (43, 3),
    "RankCommHang:peer-progress/link": (24, 24),
    "RankCommHang:peer-progress/link/partial": (3, 3),
    "RankCommHang:peer-progress/rank": (12, 12),
    "RankCommHang:two-rank/link": (18, 9),
    "RankCommSlow:cross-comm/rank": (81, 81),
    "RankCommSlow:exclusion/link": (12, 9),
    "RankCommSlow:none/suspects": (2, 0),
    "RankCommSlow:p2p-pair/link/ambiguous": (4, 0),
    "RankCommSlow:peer-progress/link": (28, 28),
    "RankCommSlow:peer-progress/link/ambiguous": (13, 0),
    "RankCommSlow:peer-progress/rank": (27, 26),
    "RankLost:heartbeat/rank": (52, 49),
    "RankNonCommHang:arrival/rank": (46, 45),
    "RankNonCommSlow:arrival/rank": (121, 96),
    "RankNonCommSlow:arrival/rank/two-rank": (7, 7),
}
