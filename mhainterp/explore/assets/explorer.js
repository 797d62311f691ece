// mhainterp explorer: one ES module for the browser page and the notebook widget (anywidget).
//
// mount(el, call) draws the explorer into `el`; `call(action, body)` returns a Promise of the
// JSON answer of the Python side (mhainterp/explore/app.py, Explorer.handle). In the browser
// `call` is an HTTP POST (httpCall); in a notebook it is a widget message (widgetCall).
// Automation hooks: every head cell has data-head="L0H2"; the overall accuracy has
// data-metric="accuracy" (its exact value in data-value); the page sets data-busy while a
// request is in flight, and data-loading while the server is still loading the model.
// A click on a model whose head numbers are attribution estimates answers at once with the
// estimate (the loss's value has data-kind="estimate", the page data-pending="<job>"), then
// asks for the exact view ("exact" {job}) and draws it (data-kind="exact"); a newer click
// cancels the older one's exact work on the Python side, and its answer is dropped here.

export function httpCall(action, body = {}) {
  return fetch(`api/${action}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  }).then(async (response) => {
    const answer = await response.json();
    if (response.status === 503 && answer.loading) {
      // The server is up but the model is still loading (mount() shows it and asks again).
      throw Object.assign(new Error(answer.loading), { loading: answer.loading });
    }
    if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
    return answer;
  });
}

export function widgetCall(model) {
  // Every view of a widget hears every reply: ids carry a per-view prefix.
  const prefix = Math.random().toString(36).slice(2);
  let next = 0;
  const waiting = new Map();
  const onReply = (msg) => {
    const entry = waiting.get(msg.id);
    if (!entry) return;
    waiting.delete(msg.id);
    if (msg.status === 200) entry.resolve(msg.body);
    else entry.reject(new Error(msg.body.error || `status ${msg.status}`));
  };
  model.on("msg:custom", onReply);
  const call = (action, body = {}) =>
    new Promise((resolve, reject) => {
      const id = `${prefix}-${++next}`;
      waiting.set(id, { resolve, reject });
      model.send({ id, action, body });
    });
  call.close = () => model.off("msg:custom", onReply);
  return call;
}

const h = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return node;
};
// replaceChildren without the null placeholders of optional parts.
const fill = (node, ...children) => node.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
const fmt = (x, digits = 3) => (Number.isFinite(x) ? x.toFixed(digits) : "–");
const signed = (x, digits = 3) => (Number.isFinite(x) ? (x > 0 ? "+" : "") + x.toFixed(digits) : "–");
// A value the saved table or the session does not have (null; NaN arrives as null in JSON).
const NOT_MEASURED = "not measured";
const signedOrNot = (x, digits) => (Number.isFinite(x) ? signed(x, digits) : NOT_MEASURED);

export function mount(root, call) {
  const ui = { state: null, view: null, lockedQuery: null, hoverQuery: null, groupBy: "target_class", detail: null };
  root.classList.add("mhx");
  root.replaceChildren(h("div", { class: "mhx-loading" }, "loading…"));

  const request = async (action, body) => {
    root.setAttribute("data-busy", "1");
    const started = performance.now();
    try {
      const answer = await call(action, body);
      return answer;
    } catch (error) {
      showError(error.message);
      throw error;
    } finally {
      ui.lastMs = performance.now() - started;
      root.removeAttribute("data-busy");
    }
  };

  const showError = (message) => {
    const bar = root.querySelector(".mhx-error");
    if (bar) bar.textContent = message;
  };

  const load = async (action = "state", body = {}) => {
    try {
      ui.state = await request(action, body);
    } catch (error) {
      if (!error.loading) {
        if (!ui.state) root.replaceChildren(h("div", { class: "mhx-error" }, error.message));
        throw error;
      }
      root.setAttribute("data-loading", "1");
      root.replaceChildren(h("div", { class: "mhx-loading" }, `${error.loading} (the page updates by itself)`));
      await new Promise((resolve) => setTimeout(resolve, 500));
      return load(action, body);
    }
    root.removeAttribute("data-loading");
    ui.view = ui.state.view;
    ui.lockedQuery = null;
    ui.detail = null;
    renderAll();
    checkEstimates();
  };

  const update = async (action, body) => {
    const clicked = performance.now();
    ui.clicks = (ui.clicks || 0) + 1;
    let answer;
    try {
      answer = await request(action, body);
    } finally {
      ui.clicks -= 1;
    }
    if (answer.estimate && answer.metrics === undefined) {
      // The estimate, at once; the exact view of this click follows (job).
      ui.view = { ...ui.view, method: answer.method, ablated: answer.ablated, estimate: answer.estimate };
      ui.job = answer.job;
      root.setAttribute("data-pending", String(answer.job));
      renderDynamic();
      root.setAttribute("data-estimate-ms", (performance.now() - clicked).toFixed(1));
      fetchExact(answer.job, clicked);
      return;
    }
    ui.job = null;
    root.removeAttribute("data-pending");
    ui.view = answer;
    renderDynamic();
    // Click-to-render time, for the benchmark and the status line.
    root.setAttribute("data-last-ms", (performance.now() - clicked).toFixed(1));
    checkEstimates();
  };

  // A head click: with estimate, when the head numbers are attribution estimates.
  const click = (label) =>
    update("toggle", { head: label, estimate: (ui.state.importance || {}).source === "attribution" });

  // The exact view of click `job`; dropped when a newer click came (its own follows).
  const fetchExact = async (job, clicked) => {
    ui.clicks = (ui.clicks || 0) + 1;
    let answer;
    try {
      answer = await call("exact", { job });
    } catch (error) {
      showError(error.message);
      return;
    } finally {
      ui.clicks -= 1;
    }
    if (ui.job !== job) return; // a newer click (or another change) has taken over
    if (answer.cancelled) return;
    ui.job = null;
    ui.view = answer;
    renderDynamic();
    root.removeAttribute("data-pending");
    root.setAttribute("data-last-ms", (performance.now() - clicked).toFixed(1));
    checkEstimates();
  };

  // While nothing else is asked, check a few more estimates against exact ablation (each
  // request ablates two heads, so a click waits at most that long), until the plan is done.
  const checkEstimates = () => {
    const check = ui.view && ui.view.estimate_check;
    if (!check || check.done || ui.checking) return;
    ui.checking = true;
    setTimeout(async () => {
      try {
        if (!ui.clicks) {
          const view = await call("verify", {});
          if (!ui.clicks && !view.cancelled) { ui.view = view; renderDynamic(); }
        }
      } catch (error) {
        return; // shown by the next request's error bar, if any
      } finally {
        ui.checking = false;
      }
      checkEstimates();
    }, 300);
  };

  // ------------------------------------------------------------------ static parts (per run)
  function renderAll() {
    const s = ui.state;
    const runPicker =
      s.runs.length > 1
        ? h(
            "label",
            { class: "mhx-pick" },
            "run: ",
            h(
              "select",
              { class: "mhx-runs", "data-control": "run", onchange: (e) => load("run", { run: e.target.value }) },
              s.runs.map((r) => h("option", r.id === s.run ? { value: r.id, selected: "" } : { value: r.id }, r.id)),
            ),
          )
        : null;
    const hint =
      s.runs.length > 1
        ? "opens on the largest head count; pick another run here"
        : "another run: mhainterp explore RUN_OR_SWEEP_FOLDER";
    const methods = h(
      "span",
      { class: "mhx-methods" },
      s.methods.map((m) =>
        h("button", { "data-method": m, onclick: () => update("method", { method: m }) }, m),
      ),
    );
    root.replaceChildren(
      h(
        "div",
        { class: "mhx-bar" },
        h("strong", {}, "mhainterp explore"),
        h("span", { class: "mhx-run" }, `${s.run} · ${s.task} · ${s.n_layers}×${s.n_heads} heads · ${s.n_eval} sequences`),
        s.note ? h("span", { class: "mhx-note", "data-note": "weights" }, s.note) : null,
        runPicker,
        h("span", { class: "mhx-hint", "data-hint": "run" }, hint),
        methods,
        h("button", { "data-action": "reset", onclick: () => update("reset", {}) }, "reset"),
        h("span", { class: "mhx-status" }),
      ),
      h("div", { class: "mhx-error" }),
      h(
        "div",
        { class: "mhx-main" },
        h(
          "section",
          { class: "mhx-grid-box" },
          h("h3", {}, "Heads: click to ablate / restore"),
          s.verdict && s.verdict.note
            ? h("div", { class: "mhx-verdict-note", "data-verdict": s.verdict.saved ? "saved" : "none" }, s.verdict.note)
            : null,
          headGrid(s),
          colourScale(s.causal),
          h("div", { class: "mhx-estimate", "data-estimate": "check" }),
          h("div", { class: "mhx-detail" }),
        ),
        h("section", { class: "mhx-metrics" }),
      ),
      h("section", { class: "mhx-example" }),
    );
    renderDynamic();
  }

  function headGrid(s) {
    const big = s.n_layers * s.n_heads > 64; // a pretrained model: smaller cells
    const grid = h("div", { class: `mhx-grid${big ? " mhx-grid-big" : ""}`, style: `grid-template-columns: auto repeat(${s.n_heads}, 1fr)` });
    for (let layer = 0; layer < s.n_layers; layer++) {
      grid.append(h("div", { class: "mhx-layer" }, `L${layer}`));
      for (const head of s.heads.filter((x) => x.layer === layer)) {
        const canvas = h("canvas", { width: 64, height: 64, class: "mhx-thumb", "data-masked": s.causal ? "causal" : "none" });
        drawPattern(canvas, s.thumbnails[head.label], s.causal);
        const thumb = h(
          "div",
          { class: "mhx-thumb-box" },
          h("span", { class: "mhx-axis-k" }, "key →"),
          h("div", { class: "mhx-thumb-row" }, h("span", { class: "mhx-axis-q" }, "query ↓"), canvas),
        );
        grid.append(
          h(
            "div",
            {
              class: "mhx-head",
              "data-head": head.label,
              title: `${head.label}: click to ablate or restore`,
              onclick: () => click(head.label),
              onmouseenter: () => { ui.detail = head; showDetail(head); },
            },
            thumb,
            h("div", { class: "mhx-head-name" }, head.label),
            h("div", { class: "mhx-head-label", title: head.finding || "" }, head.role || ""),
            h("div", { class: "mhx-head-finding", "data-finding": head.label, title: head.finding || "" }, head.finding || ""),
            h("div", { class: "mhx-head-imp", "data-importance": head.label }),
          ),
        );
      }
    }
    return grid;
  }

  // Weight w is drawn with opacity sqrt(w) (the colour scale shows it); keys a causal model
  // cannot see (k > q) are hatched grey, so "masked" never looks like "zero weight" (white).
  function drawPattern(canvas, matrix, causal) {
    const ctx = canvas.getContext("2d");
    const T = matrix.length;
    const cell = canvas.width / T;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let q = 0; q < T; q++) {
      for (let k = 0; k < T; k++) {
        const [x, y, size] = [k * cell, q * cell, Math.ceil(cell)];
        if (causal && k > q) {
          ctx.fillStyle = hatch(ctx);
          ctx.fillRect(x, y, size, size);
          continue;
        }
        const v = Math.min(1, Math.max(0, matrix[q][k]));
        if (v <= 0) continue;
        ctx.fillStyle = `rgba(38, 84, 166, ${Math.sqrt(v)})`;
        ctx.fillRect(x, y, size, size);
      }
    }
  }

  function hatch(ctx) {
    const tile = document.createElement("canvas");
    tile.width = tile.height = 4;
    const t = tile.getContext("2d");
    t.fillStyle = "#d0d0d0";
    t.fillRect(0, 0, 4, 4);
    t.strokeStyle = "#8a8a8a";
    t.beginPath();
    t.moveTo(0, 4);
    t.lineTo(4, 0);
    t.stroke();
    return ctx.createPattern(tile, "repeat");
  }

  function colourScale(causal) {
    const stops = [0, 0.25, 0.5, 0.75, 1];
    return h(
      "div",
      { class: "mhx-scale", "data-scale": "attention" },
      h("span", {}, "attention weight "),
      stops.map((w) => h("span", { class: "mhx-scale-cell", "data-weight": w, style: `background: rgba(38,84,166,${Math.sqrt(w)}); color: ${w > 0.4 ? "#fff" : "inherit"}` }, String(w))),
      causal ? h("span", { class: "mhx-scale-cell masked", "data-weight": "masked" }, "masked") : null,
      h("span", { class: "mhx-sub" }, " · rows: query ↓, columns: key →"),
    );
  }

  // What the per-head number is: exact Δaccuracy, or the attribution estimate of Δloss.
  function importanceText(method, short) {
    const imp = ui.state.importance || { source: "exact", quantity: "accuracy" };
    const what = imp.quantity === "accuracy" ? "acc" : "loss";
    if (short) return imp.source === "attribution" ? `Δ${what}≈ (${method})` : `Δ${what} alone (${method})`;
    const how = imp.source === "attribution" ? "attribution estimate (one backward at load) of " : "";
    return `${how}Δ${imp.quantity === "accuracy" ? "accuracy" : ui.state.metric.loss} when this head alone is ablated (${method})`;
  }

  // A head's number: its exact value alone once measured (a click, or the check of the
  // estimates), else the estimate, marked "≈"; a value nobody measured says so.
  function headNumber(label, short) {
    const check = ui.view.estimate_check;
    const exact = check ? check.exact[label] : undefined;
    const digits = (ui.state.importance || {}).quantity === "loss" ? (short ? 3 : 4) : short ? 2 : 3;
    if (exact !== undefined) {
      const estimate = signedOrNot(ui.view.importance[label], digits);
      return short ? `Δloss ${signed(exact, digits)} exact` : `exact Δloss alone (${ui.view.method}): ${signed(exact, digits)} (estimate was ${estimate})`;
    }
    return `${importanceText(ui.view.method, short)}${short ? " " : ": "}${signedOrNot(ui.view.importance[label], digits)}`;
  }

  // How far the estimates can be trusted: their agreement with exact ablation so far.
  function estimateText(check) {
    if (!check) return "";
    const what = "Δloss≈ is a first-order attribution estimate (one backward at load), not an ablation";
    if (check.n_checked === 0) return `${what}; checking it against exact ablation…`;
    const rho = check.spearman === null ? "Spearman not defined below 3 heads" : `Spearman ${check.spearman.toFixed(2)}`;
    const error = Number.isFinite(check.max_abs_error) ? `, largest error ${check.max_abs_error.toFixed(3)}` : "";
    const progress = check.done ? "" : ` (checking ${check.n_planned} heads…)`;
    return `${what}. Agreement with exact ablation (${ui.view.method}) on ${check.n_checked} heads: ${rho}${error}${progress}`;
  }

  function showDetail(head) {
    const box = root.querySelector(".mhx-detail");
    const rows = [
      h(
        "div",
        { "data-detail": head.label },
        h("strong", {}, head.label),
        head.role ? ` · ${head.role}` : "",
        head.finding ? ` · ${head.finding}` : "",
        ` · ${headNumber(head.label, false)}`,
        ui.view.ablated.includes(head.label) ? " · ablated now" : "",
      ),
    ];
    if (head.division && head.division.length) {
      rows.push(h("div", { class: "mhx-sub" }, "Whom it serves (division of labour, saved):"));
      rows.push(
        table(
          // helped: the share of the damage that is negative, which the selectivity clips
          ["by", "selectivity", "null", "p adj", "helped", "serves"],
          head.division.map((d) => [
            d.by, fmt(d.selectivity), fmt(d.null_mean), fmt(d.p_adj), fmt(d.helped_share), d.serves ?? "",
          ]),
        ),
      );
    }
    box.replaceChildren(...rows);
  }

  // ------------------------------------------------------------------ dynamic parts (per click)
  function renderDynamic() {
    const v = ui.view;
    const ablated = new Set(v.ablated);
    for (const cell of root.querySelectorAll("[data-head]")) {
      cell.classList.toggle("ablated", ablated.has(cell.dataset.head));
    }
    for (const node of root.querySelectorAll("[data-importance]")) {
      node.textContent = headNumber(node.dataset.importance, true);
      node.title = `${node.dataset.importance}: ${headNumber(node.dataset.importance, false)}`;
    }
    const estimate = root.querySelector("[data-estimate]");
    if (estimate) {
      estimate.textContent = estimateText(v.estimate_check);
      if (v.estimate_check) estimate.dataset.checked = String(v.estimate_check.n_checked);
    }
    if (ui.detail) showDetail(ui.detail); // the method or the ablated set changed: not stale
    for (const button of root.querySelectorAll("[data-method]")) {
      button.classList.toggle("on", button.dataset.method === v.method);
    }
    const status = root.querySelector(".mhx-status");
    if (status) status.textContent = `ablated: ${v.ablated.join(",") || "none"} · ${v.method}`;
    const error = root.querySelector(".mhx-error");
    if (error) error.textContent = "";
    renderMetrics(v.metrics, v.estimate);
    renderExample(v.example);
    const example = root.querySelector(".mhx-example");
    if (example) example.classList.toggle("mhx-waiting", Boolean(v.estimate));
  }

  // estimate: a click's attribution estimate of the loss while its exact value is computed
  // (the loss shows it, marked "≈ estimate"; accuracy and the tables wait, dimmed).
  function renderMetrics(m, estimate) {
    const box = root.querySelector(".mhx-metrics");
    box.classList.toggle("mhx-waiting", Boolean(estimate));
    const o = m.overall;
    const metric = (name, pair, better, title = name, kind = "exact") =>
      h(
        "div",
        { class: "mhx-big" },
        h("div", { class: "mhx-big-name" }, kind === "estimate" ? `${title} ≈ estimate` : title),
        h(
          "div",
          { class: "mhx-big-value", "data-metric": name, "data-kind": kind, "data-value": String(pair.ablated) },
          kind === "pending" ? "…" : `${kind === "estimate" ? "≈ " : ""}${fmt(pair.ablated, 4)}`,
        ),
        h("div", { class: "mhx-big-clean", "data-metric-clean": name }, `clean ${fmt(pair.clean, 4)} · Δ ${kind === "pending" ? "…" : signed(pair.ablated - pair.clean, 4)}`),
        h("div", { class: `mhx-bar-outer` }, bar(pair, better)),
      );
    // The division of labour's axes, or the text axes of a pretrained model (state.axes).
    const axes = (ui.state.axes || []).filter((a) => a.key !== "target");
    const groups = Object.fromEntries(axes.map((a) => [a.key, a.name]));
    if (!(ui.groupBy in groups) && axes.length) ui.groupBy = axes[0].key;
    const withAccuracy = !ui.state.metric || ui.state.metric.accuracy;
    const lossName = ui.state.metric ? ui.state.metric.loss : "loss";
    const switcher = h(
      "span",
      { class: "mhx-groups" },
      Object.entries(groups).map(([key, name]) =>
        h("button", { class: ui.groupBy === key ? "on" : "", "data-group": key, onclick: () => { ui.groupBy = key; renderMetrics(ui.view.metrics, ui.view.estimate); } }, name),
      ),
    );
    const rows = (list) =>
      withAccuracy
        ? list.map((r) => [r.key, r.n, fmt(r.accuracy.clean), fmt(r.accuracy.ablated), signed(r.accuracy.ablated - r.accuracy.clean), fmt(r.loss.ablated)])
        : list.map((r) => [r.key, r.n, fmt(r.loss.clean, 4), fmt(r.loss.ablated, 4), signed(r.loss.ablated - r.loss.clean, 4)]);
    const head = withAccuracy ? ["", "n", "acc clean", "acc now", "Δ", "loss now"] : ["", "n", "clean", "now", "Δ"];
    fill(
      box,
      h("h3", {}, `Metrics vs clean (${o.n_scored} scored ${ui.state.objective === "classes" || !ui.state.objective ? "pairs" : "tokens"})`),
      h(
        "div",
        { class: "mhx-bigs" },
        withAccuracy
          ? estimate
            ? metric("accuracy", { clean: o.accuracy.clean, ablated: null }, "high", "accuracy", "pending")
            : metric("accuracy", o.accuracy, "high")
          : null,
        estimate ? metric("loss", estimate.loss, "low", lossName, "estimate") : metric("loss", o.loss, "low", lossName),
      ),
      estimate
        ? h(
            "div",
            { class: "mhx-estimate-note", "data-estimate-note": "pending" },
            `≈ attribution estimate of this click (first order: the sum of the ablated heads' estimates, no forward); the exact value follows…`,
          )
        : null,
      m.by.target && m.by.target.length > 1 ? h("div", {}, h("h4", {}, "per target"), table(head, rows(m.by.target), "target")) : null,
      h("h4", {}, "by ", switcher),
      table(head, rows(m.by[ui.groupBy]), ui.groupBy),
    );
  }

  function bar(pair, better) {
    // Accuracy bars on [0, 1]; loss bars scaled to the larger of the two.
    const top = better === "high" ? 1 : Math.max(pair.clean, pair.ablated, 1e-9);
    const width = (x) => `${Math.max(0, Math.min(1, x / top)) * 100}%`;
    return h(
      "div",
      { class: "mhx-bars" },
      h("div", { class: "mhx-bar-clean", style: `width:${width(pair.clean)}` }),
      h("div", { class: "mhx-bar-now", style: `width:${width(pair.ablated)}` }),
    );
  }

  function table(head, rows, name) {
    return h(
      "table",
      { class: "mhx-table", "data-table": name },
      h("tr", {}, head.map((x) => h("th", {}, x))),
      rows.map((r) => h("tr", {}, r.map((x) => h("td", {}, x)))),
    );
  }

  // Real text: the sentence's tokens, each coloured by the change in log-probability of that
  // token as the next token (red: the ablation makes it less likely, blue: more likely).
  function renderTextExample(ex) {
    const box = root.querySelector(".mhx-example");
    const text = ex.text;
    const row = h("div", { class: "mhx-tokens mhx-text", "data-text-row": String(ex.index) });
    const deltas = text.delta_logprob || [];
    const scale = Math.max(0.05, ...deltas.filter((d) => d !== null).map((d) => Math.abs(d)));
    for (let t = 0; t < ex.tokens.length; t++) {
      if (!ex.real[t]) continue;
      const delta = t > 0 ? deltas[t - 1] : null; // position t-1 predicts token t
      const strength = delta === null || delta === undefined ? 0 : Math.min(1, Math.abs(delta) / scale);
      const colour = delta < 0 ? `rgba(176,0,32,${strength})` : `rgba(38,84,166,${strength})`;
      const tip = delta === null || delta === undefined
        ? `position ${t}: not predicted`
        : `position ${t}: Δ log p = ${signed(delta, 4)} (clean log p ${fmt(text.clean_logprob[t - 1], 3)}); top next token now ${JSON.stringify(text.predictions[t - 1])}, clean ${JSON.stringify(text.clean_predictions[t - 1])}`;
      row.append(
        h(
          "span",
          {
            class: "mhx-token mhx-text-token",
            "data-pos": t,
            "data-delta": delta === null || delta === undefined ? "" : String(delta),
            title: tip,
            style: `background: ${colour}; color: ${strength > 0.5 ? "#fff" : "inherit"}`,
            onmouseenter: () => { ui.hoverQuery = t; renderAttention(ex); },
            onmouseleave: () => { ui.hoverQuery = null; renderAttention(ex); },
            onclick: () => { ui.lockedQuery = ui.lockedQuery === t ? null : t; renderAttention(ex); },
          },
          text.tokens[t].replace(/ /g, "\u00a0"),
        ),
      );
    }
    const summary =
      text.damage !== undefined
        ? `embedding damage of this sentence (1 − cos to clean): ${fmt(text.damage, 4)}`
        : `each token coloured by Δ log p of it as the next token (ablated − clean; red: less likely, blue: more likely; scale ±${fmt(scale, 3)})`;
    box.replaceChildren(
      h("h3", {}, `Example sentence #${ex.index} `, h("button", { "data-action": "draw", onclick: () => update("example", { draw: true }) }, "draw another")),
      h("div", { class: "mhx-sub" }, summary),
      row,
      h("div", { class: "mhx-attn" }),
    );
    renderAttention(ex);
  }

  function renderExample(ex) {
    if (ex.text) return renderTextExample(ex);
    const box = root.querySelector(".mhx-example");
    const T = ex.tokens.length;
    const tokenRow = h("div", { class: "mhx-tokens" });
    for (let t = 0; t < T; t++) {
      if (!ex.real[t]) continue;
      const marks = ex.predictions[t].map((p, j) => {
        if (!ex.scored[t][j]) return h("div", { class: "mhx-pred none" }, "·");
        const ok = ex.correct[t][j];
        const changed = p !== ex.clean_predictions[t][j];
        return h(
          "div",
          { class: `mhx-pred ${ok ? "right" : "wrong"}${changed ? " changed" : ""}`, "data-correct": ok ? "1" : "0", title: `target ${ex.targets[t][j]}, clean prediction ${ex.clean_predictions[t][j]}` },
          `${p}${ok ? "✓" : "✗"}`,
        );
      });
      tokenRow.append(
        h(
          "div",
          {
            class: "mhx-token",
            "data-pos": t,
            onmouseenter: () => { ui.hoverQuery = t; renderAttention(ex); },
            onmouseleave: () => { ui.hoverQuery = null; renderAttention(ex); },
            onclick: () => { ui.lockedQuery = ui.lockedQuery === t ? null : t; renderAttention(ex); },
          },
          h("div", { class: "mhx-posnum", title: `position ${t}` }, t),
          h("div", { class: "mhx-tok" }, ex.tokens[t]),
          h("div", { class: "mhx-tgt" }, ex.targets[t].map((x) => (x < 0 ? "·" : x)).join(",")),
          marks,
        ),
      );
    }
    const right = ex.correct.flat().filter(Boolean).length;
    const scored = ex.scored.flat().filter(Boolean).length;
    box.replaceChildren(
      h("h3", {}, `Example sequence #${ex.index} · ${right}/${scored} right `, h("button", { "data-action": "draw", onclick: () => update("example", { draw: true }) }, "draw another")),
      h("div", { class: "mhx-sub" }, `position, token, target and the prediction at each of ${T} positions (✓ right, ✗ wrong; outlined = differs from the clean model)`),
      tokenRow,
      h("div", { class: "mhx-attn" }),
    );
    renderAttention(ex);
  }

  // Hover a token: where each head attends from it (CircuitsVis habit); click locks it.
  function renderAttention(ex) {
    const query = ui.lockedQuery ?? ui.hoverQuery;
    for (const node of root.querySelectorAll(".mhx-token")) {
      const t = Number(node.dataset.pos);
      node.classList.toggle("query", t === query);
      node.classList.toggle("locked", t === ui.lockedQuery);
    }
    const box = root.querySelector(".mhx-attn");
    if (query === null || query === undefined) {
      box.replaceChildren(h("div", { class: "mhx-sub" }, "hover a token to see where each head attends from it; click to lock"));
      return;
    }
    if (!ex.attention) {
      // A large model: ask for this one query's row of every head (then draw it).
      const wanted = `${ex.index}:${query}:${ui.view.method}:${ui.view.ablated.join(",")}`;
      if (ui.attentionKey !== wanted) {
        ui.attentionKey = wanted;
        call("attention", { query }).then((answer) => {
          if (ui.attentionKey !== wanted) return;
          ui.attentionRows = answer.attention;
          renderAttentionRows(ex, query, answer.attention);
        }).catch((error) => showError(error.message));
        box.replaceChildren(h("div", { class: "mhx-sub" }, `where each head attends from position ${query}: loading…`));
        return;
      }
      if (ui.attentionRows) renderAttentionRows(ex, query, ui.attentionRows);
      return;
    }
    renderAttentionRows(ex, query, Object.fromEntries(Object.entries(ex.attention).map(([label, p]) => [label, p[query]])));
  }

  function renderAttentionRows(ex, query, rowsByHead) {
    const box = root.querySelector(".mhx-attn");
    const tokenText = (k) => (ex.text ? ex.text.tokens[k] : ex.tokens[k]);
    const locked = ui.lockedQuery !== null ? " · locked, click the token again to unlock" : "";
    const ablated = new Set(ui.view.ablated);
    const causal = ui.state.causal;
    const positions = h("div", { class: "mhx-attn-row mhx-attn-positions" }, h("span", { class: "mhx-attn-name" }, "pos"));
    ex.tokens.forEach((_, k) => {
      if (ex.real[k]) positions.append(h("span", { class: "mhx-attn-cell mhx-posnum", "data-key-pos": k }, k));
    });
    const rows = Object.entries(rowsByHead).map(([label, weights]) => {
      const off = ablated.has(label);
      const row = h(
        "div",
        { class: `mhx-attn-row${off ? " ablated" : ""}`, "data-attn": label, title: off ? `${label} is ablated: its output is replaced, the pattern is what it would compute` : null },
        h("span", { class: "mhx-attn-name" }, label),
      );
      weights.forEach((w, k) => {
        if (!ex.real[k]) return;
        if (causal && k > query) {
          row.append(h("span", { class: "mhx-attn-cell masked", title: `${label}: position ${k} is masked (after the query)` }, tokenText(k)));
          return;
        }
        const style = `background: rgba(38,84,166,${Math.sqrt(Math.max(0, w))}); color: ${w > 0.4 ? "#fff" : "inherit"}`;
        row.append(h("span", { class: "mhx-attn-cell", title: `${label}: ${fmt(w)} on position ${k}`, style }, tokenText(k)));
      });
      return row;
    });
    box.replaceChildren(
      h("div", { class: "mhx-sub" }, `where each head attends from position ${query} (token ${tokenText(query)})${locked}; hatched = masked, greyed row = ablated head`),
      positions,
      ...rows,
    );
  }

  load().catch(() => {});
  return { reload: () => load() };
}

// anywidget entry point: the notebook view talks to the same Python handler through messages.
export default {
  render({ model, el }) {
    const call = widgetCall(model);
    mount(el, call);
    return () => call.close(); // anywidget calls this when the view is removed
  },
};
