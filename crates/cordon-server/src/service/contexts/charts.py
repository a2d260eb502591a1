# Chart data of a matplotlib figure, in the shape E2B's SDKs read as `result.chart` (type,
# title, axes' labels, units, ticks and scales, elements). Prepended to driver.py; called
# only for a figure a cell shows, so a cell without one pays nothing for it.


def _chart_of(fig):
    import math
    from importlib import import_module as mod  # matplotlib: the sandbox's, already loaded

    def num(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return f if math.isfinite(f) else None

    def text(t):
        s = t.get_text() if t is not None else ""
        return s or None

    def unit(label):
        # "Time (s)" or "Price [USD]": the unit in the label's last brackets.
        if label and label[-1:] in ")]":
            open_ = "(" if label[-1] == ")" else "["
            i = label.rfind(open_)
            if i > 0:
                return label[i + 1:-1].strip() or None
        return None

    def scale(axis, name):
        conv = getattr(axis, "converter", None)
        mod = type(conv).__module__ if conv is not None else ""
        if "dates" in mod:
            return "datetime"
        if "category" in mod:
            return "categorical"
        return name if name in ("linear", "log", "symlog", "logit", "function",
                                "functionlog", "asinh") else "unknown"

    def value(axis, sc, v):
        # A data value as E2B shows it: a date's ISO text, a category's name, else a number.
        if sc == "datetime":
            try:
                return mod("matplotlib.dates").num2date(float(v)).isoformat()
            except (TypeError, ValueError, OverflowError):
                return num(v)
        if sc == "categorical":
            units = getattr(axis, "units", None)
            mapping = getattr(units, "_mapping", None) or {}
            for k, i in mapping.items():
                if i == v:
                    return str(k)
        return num(v)

    def axes2d(ax):
        out = {"title": text(ax.title)}
        for c, axis, get_scale in (("x", ax.xaxis, ax.get_xscale), ("y", ax.yaxis,
                                                                       ax.get_yscale)):
            label = axis.get_label().get_text() or None
            sc = scale(axis, get_scale())
            ticks = list(axis.get_ticklocs())
            out.update({f"{c}_label": label, f"{c}_unit": unit(label), f"{c}_scale": sc,
                        f"{c}_ticks": [value(axis, sc, t) for t in ticks],
                        f"{c}_tick_labels": [t.get_text() for t in axis.get_ticklabels()]})
        return out

    def label_of(artist):
        lab = artist.get_label() or ""
        return "" if lab.startswith("_") else lab

    def pie(ax, wedges):
        return {"type": "pie", "title": text(ax.title),
                "elements": [{"label": w.get_label(),
                              "angle": num(round(abs(w.theta2 - w.theta1), 4)),
                              "radius": num(w.r)} for w in wedges]}

    def bars(ax):
        BarContainer = mod("matplotlib.container").BarContainer
        conts = [c for c in ax.containers if isinstance(c, BarContainer)]
        d = axes2d(ax)
        elements = []
        horizontal = any(getattr(c, "orientation", "vertical") == "horizontal" for c in conts)
        axis = ax.yaxis if horizontal else ax.xaxis
        locs = list(axis.get_ticklocs())
        names = [t.get_text() for t in axis.get_ticklabels()]
        for c in conts:
            group = c.get_label() or ""
            group = "" if group.startswith("_") else group
            for r in c.patches:
                pos = r.get_y() + r.get_height() / 2 if horizontal else r.get_x() + r.get_width() / 2
                size = r.get_width() if horizontal else r.get_height()
                label = ""
                if locs:
                    j = min(range(len(locs)), key=lambda k: abs(locs[k] - pos))
                    if abs(locs[j] - pos) < 0.5 and j < len(names):
                        label = names[j]
                elements.append({"label": label or str(num(pos)), "group": group,
                                 "value": num(size)})
        d.update(type="bar", elements=elements)
        return d

    def boxes(ax, lines):
        # A boxplot's pieces: each box a closed rectangle (5 points), its median the
        # 2-point line across it, its whiskers 2-point lines from the box out, its fliers
        # markers without a line.
        PathPatch = mod("matplotlib.patches").PathPatch
        rects = []
        for ln in lines:
            xs, ys = list(ln.get_xdata()), list(ln.get_ydata())
            if len(xs) == 5 and xs[0] == xs[3] == xs[4] and xs[1] == xs[2] \
                    and ys[0] == ys[1] == ys[4] and ys[2] == ys[3]:
                rects.append((min(xs), max(xs), min(ys), max(ys)))
        for p in ax.patches:
            if isinstance(p, PathPatch):
                v = p.get_path().vertices
                rects.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max()))
        if not rects:
            return None
        d = axes2d(ax)
        locs, names = list(ax.xaxis.get_ticklocs()), [t.get_text() for t in ax.xaxis.get_ticklabels()]
        elements = []
        for x0, x1, q1, q3 in rects:
            c = (x0 + x1) / 2
            med, lo, hi, out = None, q1, q3, []
            for ln in lines:
                xs, ys = list(ln.get_xdata()), list(ln.get_ydata())
                if len(xs) == 2 and ys[0] == ys[1] and x0 <= min(xs) and max(xs) <= x1 \
                        and q1 <= ys[0] <= q3 and xs[0] != xs[1] and (xs[0], xs[1]) == (x0, x1):
                    med = ys[0]
                elif len(xs) == 2 and xs[0] == xs[1] == c and ys[0] != ys[1]:
                    lo, hi = min(lo, *ys), max(hi, *ys)
                elif ln.get_linestyle() in ("None", "none", "", " ") and len(xs) \
                        and all(abs(x - c) < (x1 - x0) for x in xs):
                    out.extend(num(y) for y in ys)
            label = ""
            if locs:
                j = min(range(len(locs)), key=lambda k: abs(locs[k] - c))
                label = names[j] if j < len(names) else ""
            elements.append({"label": label, "min": num(lo), "first_quartile": num(q1),
                             "median": num(med if med is not None else (q1 + q3) / 2),
                             "third_quartile": num(q3), "max": num(hi), "outliers": out})
        d.update(type="box_and_whisker", elements=elements)
        return d

    def points(ax, kind, series):
        d = axes2d(ax)
        xs_, ys_ = d["x_scale"], d["y_scale"]
        d.update(type=kind, elements=[
            {"label": label, "points": [[value(ax.xaxis, xs_, x), value(ax.yaxis, ys_, y)]
                                        for x, y in pts]} for label, pts in series])
        return d

    def chart(ax):
        PathCollection = mod("matplotlib.collections").PathCollection
        Wedge = mod("matplotlib.patches").Wedge
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges and len(wedges) == len(ax.patches):
            return pie(ax, wedges)
        lines = [ln for ln in ax.get_lines() if ln.get_visible()]
        if any(len(ln.get_xdata()) == 5 for ln in lines) or any(
                type(p).__name__ == "PathPatch" for p in ax.patches):
            b = boxes(ax, lines)
            if b is not None:
                return b
        if ax.containers and ax.patches:
            return bars(ax)
        scat = [c for c in ax.collections if isinstance(c, PathCollection)]
        if scat and not lines:
            return points(ax, "scatter", [
                (label_of(c), [tuple(o) for o in c.get_offsets()]) for c in scat])
        if lines:
            return points(ax, "line", [
                (label_of(ln), list(zip(ln.get_xdata(), ln.get_ydata()))) for ln in lines])
        d = {"type": "unknown", "title": text(ax.title), "elements": []}
        return d

    axes = [a for a in fig.get_axes() if a.get_visible() and a.get_label() != "<colorbar>"]
    if not axes:
        return None
    if len(axes) == 1:
        return chart(axes[0])
    sup = getattr(fig, "_suptitle", None)
    return {"type": "superchart", "title": text(sup), "elements": [chart(a) for a in axes]}
