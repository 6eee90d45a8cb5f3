# The smoke test of jazzmine-python-datascience (make datascience-image): build.sh runs
# it in the new image as uid 1000, with a read-only root, a tmpfs /tmp and no network,
# as a sandbox would, with no MPLCONFIGDIR (matplotlib falls back to a temporary one).
import numpy as np
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt

assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
a = np.arange(1, 10001, dtype=float).reshape(100, 100)
assert np.allclose(a @ np.eye(100), a)
df = pd.DataFrame({"x": [1, 2, 3, 4], "y": [1.0, 4.0, 9.0, 16.0]})
assert df["y"].sum() == 30.0 and df.groupby(df["x"] % 2)["y"].mean().to_dict() == {0: 10.0, 1: 5.0}

fig, ax = plt.subplots()
ax.plot(df["x"], df["y"], label="y")
ax.set_title("smoke")  # renders text: needs a font
ax.legend()
fig.savefig("/tmp/smoke.png")
with open("/tmp/smoke.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
print("numpy", np.__version__, "pandas", pd.__version__, "matplotlib", matplotlib.__version__, "(Agg): PNG ok")
