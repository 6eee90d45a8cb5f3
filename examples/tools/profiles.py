"""An async tool: scripts call fetch_profile(42) like any other function."""

import asyncio

_PROFILES = {
    1: {"name": "Ada", "plan": "pro"},
    2: {"name": "Grace", "plan": "free"},
}


async def fetch_profile(user_id: int) -> dict:
    """Returns the profile of user_id (a pretend remote lookup)."""
    await asyncio.sleep(0.01)
    profile = _PROFILES.get(int(user_id), {"name": "unknown", "plan": "none"})
    return {"user_id": int(user_id), **profile}
