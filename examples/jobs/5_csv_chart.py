# A CSV in, a chart and a table out (the datascience sandbox):
#   worker submit --sandbox datascience --file examples/data/sales.csv:data/sales.csv --out demo-out examples/jobs/5_csv_chart.py
import os

import matplotlib.pyplot as plt
import pandas as pd

sales = pd.read_csv("data/sales.csv")
sales["revenue"] = sales["units"] * sales["price"]
by_region = sales.pivot_table(index="region", columns="product", values="revenue", aggfunc="sum").round(2)

display(by_region)  # a table: text and HTML

fig, ax = plt.subplots(figsize=(7, 3.5))
by_region.plot.bar(ax=ax, stacked=True)
ax.set_ylabel("revenue")
ax.set_title("February revenue by region")
ax.legend(title="product", loc="upper left", bbox_to_anchor=(1, 1))
fig.tight_layout()
plt.show()  # the chart: a PNG through the object store

os.makedirs("out", exist_ok=True)
by_region.to_csv("out/revenue_by_region.csv")  # an artifact
emit_result({"rows": len(sales), "total_revenue": round(float(sales["revenue"].sum()), 2)})
