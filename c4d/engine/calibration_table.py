"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (57, 57),
    "RankCommHang:cross-comm/node": (15, 15),
    "RankCommHang:exclusion/node/equivalent": (42, 42),
    "RankCommHang:none/suspects": (6, 0),
    "RankCommHang:p2p-pair/link/equivalent": (42, 9),
    "RankCommHang:peer-progress/link": (15, 15),
    "RankCommHang:peer-progress/link/equivalent": (6, 3),
    "RankCommHang:peer-progress/node": (3, 3),
    "RankCommHang:peer-progress/rank/equivalent": (6, 6),
    "RankCommHang:two-rank/link/equivalent": (15, 3),
    "RankCommSlow:cross-comm/node": (13, 13),
    "RankCommSlow:cross-comm/rank": (55, 53),
    "RankCommSlow:cross-comm/rank/equivalent": (5, 5),
    "RankCommSlow:exclusion/link": (11, 10),
    "RankCommSlow:exclusion/node": (2, 2),
    "RankCommSlow:exclusion/node/equivalent": (7, 4),
    "RankCommSlow:exclusion/rank": (1, 0),
    "RankCommSlow:none/suspects/undecided": (2, 0),
    "RankCommSlow:p2p-pair/link/equivalent": (3, 0),
    "RankCommSlow:peer-progress/link": (2, 2),
    "RankCommSlow:peer-progress/link/equivalent": (5, 0),
    "RankCommSlow:peer-progress/node": (6, 6),
    "RankCommSlow:peer-progress/rank": (1, 1),
    "RankLost:heartbeat/rank": (87, 87),
    "RankLost:heartbeat/suspects": (2, 0),
    "RankNonCommHang:arrival/rank": (125, 125),
    "RankNonCommHang:arrival/rank/missing": (13, 0),
    "RankNonCommSlow:arrival/rank": (101, 97),
    "RankNonCommSlow:arrival/rank/two-rank": (30, 30),
}
