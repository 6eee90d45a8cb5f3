# An async tool called like a plain function: the harness runs its event loop.
profiles = [fetch_profile(user_id) for user_id in (1, 2)]
emit_result(profiles)
