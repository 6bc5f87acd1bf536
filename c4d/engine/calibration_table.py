"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (48, 48),
    "RankCommHang:none/suspects": (39, 0),
    "RankCommHang:p2p-pair/link": (49, 0),
    "RankCommHang:peer-progress/link": (12, 12),
    "RankCommHang:peer-progress/rank": (6, 6),
    "RankCommHang:two-rank/link": (36, 15),
    "RankCommSlow:cross-comm/rank": (60, 58),
    "RankCommSlow:exclusion/link": (18, 11),
    "RankCommSlow:none/suspects": (10, 0),
    "RankCommSlow:p2p-pair/link/ambiguous": (1, 0),
    "RankCommSlow:peer-progress/link": (10, 10),
    "RankCommSlow:peer-progress/link/ambiguous": (2, 1),
    "RankCommSlow:peer-progress/rank": (23, 23),
    "RankCommSlow:two-rank/link/ambiguous": (12, 0),
    "RankLost:heartbeat/rank": (76, 74),
    "RankNonCommHang:arrival/rank": (103, 100),
    "RankNonCommSlow:arrival/rank": (101, 96),
    "RankNonCommSlow:arrival/rank/two-rank": (4, 4),
}
