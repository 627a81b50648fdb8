"""Group rewards: score a group's runs relative to each other.

``Trainer(..., group_reward=fn)`` takes any :class:`arttrace.GroupRewardFn`, a function of an
:class:`arttrace.Group`; this package holds the built-in one, :func:`ruler`, an LLM judge::

    from arttrace.rewards import ruler

    trainer = at.Trainer(..., group_reward=ruler(model="gpt-5.4", base_url=...))
"""

from .._lazy import lazy
from ._ruler import DEFAULT_RUBRIC, JudgeError, Ruler, ruler

__all__ = ["DEFAULT_RUBRIC", "JudgeError", "Ruler", "ruler"]

__getattr__, __dir__ = lazy(
    __name__,
    {},
    deprecated={name: f"arttrace.{name}" for name in ("Group", "GroupRewards", "GroupRun")}
    | {"GroupReward": "arttrace.GroupRewardFn"},
)
