"""Group rewards: score a group's runs relative to each other.

``Trainer(..., group_reward=fn)`` takes any function of an :class:`arttrace.Group`; this
package holds the built-in one, :func:`ruler`, an LLM judge::

    from arttrace.rewards import ruler

    trainer = at.Trainer(..., group_reward=ruler(model="gpt-5.4", base_url=...))
"""

from ..training._group import Group, GroupReward, GroupRewards, GroupRun
from ._ruler import DEFAULT_RUBRIC, JudgeError, Ruler, ruler

__all__ = [
    "DEFAULT_RUBRIC",
    "Group",
    "GroupReward",
    "GroupRewards",
    "GroupRun",
    "JudgeError",
    "Ruler",
    "ruler",
]
