// GPU Warden console: plain modern JavaScript, no build step, no framework.
// Every value that comes from the API reaches the page through textContent or an attribute set
// by setAttribute on an element we created: never innerHTML, so a job label holding markup
// shows as text. The session cookie is HttpOnly; writes send the CSRF token from /api/v1/session.
"use strict";

(() => {
  const app = document.getElementById("app");
  const GIB = 1024 ** 3;
  // How a job became known (service.vocabulary.JOB_SOURCE_TEXT; a unit test keeps them equal).
  const JOB_SOURCE_TEXT = { api: "registered by its scheduler or the API", observed: "found from its processes on the GPUs" };
  let session = null;
  let causes = [];
  let states = [];

  // --- small helpers ---------------------------------------------------------------------

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null || kid === false) continue;
      node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return node;
  }

  function clear(node) {
    node.replaceChildren();
    return node;
  }

  const usdFormat = new Intl.NumberFormat("en-US", {
    style: "currency", currency: "USD", minimumFractionDigits: 2, maximumFractionDigits: 2,
  });
  const usd = (v) => (v === null || v === undefined ? "–" : usdFormat.format(v));
  const pct = (v) => (v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`);
  const hours = (s) => (s === null || s === undefined ? "–" : (s / 3600).toFixed(s < 36000 ? 2 : 1));
  // Dollars where priced, else the same figure in GPU-hours (a site without prices).
  const amount = (v, gpuHours) => (v === null && typeof gpuHours === "number" ? `${hours(gpuHours * 3600)} GPU-h` : usd(v));
  const gib = (b) => (b === null || b === undefined ? "–" : (b / GIB).toFixed(b < 10 * GIB ? 1 : 0));

  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return `${d.toISOString().slice(0, 10)} ${d.toISOString().slice(11, 16)}Z`;
  }

  function causeColor(name) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(`--c-${name}`);
    return v.trim() || "#98a2b3";
  }

  function causeChip(name) {
    if (!name) return el("span", { class: "muted", text: "–" });
    return el("span", { class: "chip", title: causeMeaning(name) },
      el("span", { class: `dot c-${name}` }), name.replaceAll("_", " "));
  }

  function stateMeaning(name) {
    const x = states.find((s) => s.name === name);
    return x ? x.meaning : "";
  }

  function causeMeaning(name) {
    const c = causes.find((x) => x.name === name);
    if (!c) return "";
    return c.fix ? `${c.meaning}; fix: ${c.fix}` : c.meaning;
  }

  function meter(value, kind, label) {
    if (value === null || value === undefined) return el("span", { class: "muted", text: "–" });
    const bar = el("span");
    bar.style.width = `${Math.max(0, Math.min(1, value)) * 100}%`;
    return el("span", {}, el("span", { class: `meter ${kind || ""}` }, bar), label ?? pct(value));
  }

  function jobLink(id) {
    return el("a", { href: `/jobs/${encodeURIComponent(id)}`, text: id });
  }

  // A user's or team's own page (service.vocabulary.owner_page_path): the name one segment.
  function ownerLink(kind, name, search = "") {
    if (!name) return "";
    return el("a", { href: `/${kind}s/${encodeURIComponent(name)}${search}`, text: name });
  }

  function labelsText(labels) {
    return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  }

  function card(key, value, cls) {
    return el("div", { class: "card" }, el("div", { class: "k", text: key }),
      el("div", { class: `v ${cls || ""}`, text: value }));
  }

  // A table fits its page at any width: as it is where it fits; else compact (tighter cells);
  // else collapsed, each row a block of "label: value" cells, so that no column (the waste
  // above all) is ever off-screen and the page never scrolls sideways.
  function table(headers, rows, attrs) {
    const labels = headers.map((h) => (Array.isArray(h) ? h[0] : h));
    const head = el("tr", {}, headers.map((h) => {
      const [text, cls] = Array.isArray(h) ? h : [h, ""];
      return el("th", { class: cls, text });
    }));
    const body = el("tbody", {}, rows);
    const wrap = el("div", { class: "tablewrap" }, el("table", attrs || {}, el("thead", {}, head), body));
    const box = el("div", { class: "tablebox" }, wrap);
    // Each cell names its column (the collapsed layout shows it), rows added later too.
    const label = (tr) => {
      if (tr.children.length !== labels.length) return; // a row spanning the table (a note)
      [...tr.children].forEach((cell, i) => { if (labels[i]) cell.dataset.label = labels[i]; });
    };
    [...body.children].forEach(label);
    let width = -1;
    const fit = () => {
      box.classList.remove("compact", "collapsed");
      for (const mode of ["compact", "collapsed"]) {
        if (wrap.scrollWidth <= wrap.clientWidth + 1) break;
        box.classList.remove("compact");
        box.classList.add(mode);
      }
      box.dataset.fit = box.classList.contains("collapsed") ? "collapsed" : box.classList.contains("compact") ? "compact" : "full";
    };
    new MutationObserver((changes) => {
      for (const c of changes) c.addedNodes.forEach((n) => { if (n.tagName === "TR") label(n); });
      fit();
    }).observe(body, { childList: true });
    // Only a change of the box's width refits it: its height follows the layout chosen.
    new ResizeObserver(([entry]) => {
      const w = Math.round(entry.contentRect.width);
      if (w !== width) { width = w; fit(); }
    }).observe(box);
    return box;
  }

  function td(content, cls, attrs) {
    return el("td", { class: cls, ...(attrs || {}) }, content);
  }

  function page(title, sub, ...kids) {
    clear(app).append(el("h1", { text: title }), sub ? el("p", { class: "sub" }, sub) : "", ...kids);
  }

  function showError(err) {
    document.getElementById("loading")?.remove(); // the error replaces the placeholder
    app.append(el("p", { class: "err", text: `Could not load: ${err.message || err}` }));
  }

  // --- the API ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(typeof detail === "string" ? detail : JSON.stringify(detail));
      this.status = status;
    }
  }

  const BUSY_RETRIES = 3; // a read the service turned away as busy (503) is asked again

  // With `counted`, a list's rows and the total its X-Total-Count header gives.
  async function api(path, { method = "GET", body, counted = false } = {}) {
    const headers = { Accept: "application/json" };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      if (session && session.csrf_token) headers["X-CSRF-Token"] = session.csrf_token;
    }
    let response;
    for (let attempt = 0; ; attempt += 1) {
      response = await fetch(`/api/v1${path}`, {
        method, headers, credentials: "same-origin",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (response.status !== 503 || method !== "GET" || attempt >= BUSY_RETRIES) break;
      // The service bounds concurrent reads and says when to come back.
      const seconds = Math.min(Number(response.headers.get("Retry-After")) || 1, 5);
      await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
    }
    if (response.status === 401 && location.pathname !== "/login") {
      location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
      throw new ApiError(401, "not logged in");
    }
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail; } catch { /* not JSON */ }
      if (Array.isArray(detail)) detail = detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
      throw new ApiError(response.status, detail);
    }
    if (counted) return { rows: await response.json(), total: Number(response.headers.get("X-Total-Count")), start: response.headers.get("X-Report-Start"), end: response.headers.get("X-Report-End") };
    return response.status === 204 ? null : response.json();
  }

  const q = (params) => new URLSearchParams(Object.entries(params).filter(([, v]) => v)).toString();

  // --- login -----------------------------------------------------------------------------

  // Where to go after logging in: `next` only when the browser itself resolves it to one of the
  // console's own pages on this origin (a backslash, `//`, a scheme or dot segments can make a
  // path that looks local lead elsewhere), else the fleet page.
  const CONSOLE_PATHS = ["/", "/jobs", "/costs", "/alerts", "/actions"];
  // Pages of one object: a job, a user, a team.
  const OWN_PAGE = /^\/(jobs|users|teams)\/[^/]/;

  function consoleTarget(next) {
    if (!next) return "/";
    let url;
    try { url = new URL(next, location.origin); } catch { return "/"; }
    const page = CONSOLE_PATHS.includes(url.pathname) || OWN_PAGE.test(url.pathname);
    if (url.origin !== location.origin || !page) return "/";
    return url.pathname + url.search + url.hash;
  }

  function loginPage() {
    const input = el("input", { type: "password", id: "token", autocomplete: "off", placeholder: "gw_…", required: true });
    const error = el("p", { class: "err", role: "alert" });
    const form = el("form", { class: "panel login", id: "login-form" },
      el("h1", { text: "Log in" }),
      el("p", { class: "muted", text: "Paste a reader or admin token (gpuwarden token create --role reader). It is exchanged for a session cookie and not kept by the page." }),
      el("label", { for: "token", text: "Token" }), input,
      el("button", { type: "submit", text: "Log in" }), error);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.textContent = "";
      try {
        await api("/session", { method: "POST", body: { token: input.value } });
        input.value = "";
        location.assign(consoleTarget(new URLSearchParams(location.search).get("next")));
      } catch (err) {
        error.textContent = err.status === 401 ? "Unknown or revoked token." : err.message;
      }
    });
    clear(app).append(form);
    input.focus();
    // Single sign-on, where the site set it up: the identity provider signs the person in.
    fetch("/console/sso.json").then((r) => r.json()).then((sso) => {
      if (!sso.enabled) return;
      const next = consoleTarget(new URLSearchParams(location.search).get("next"));
      form.insertBefore(el("p", {},
        el("a", { class: "button", id: "sso", href: `/api/v1/auth/oidc/login?next=${encodeURIComponent(next)}`, text: "Sign in with single sign-on" })),
      form.querySelector("p.muted"));
    }).catch(() => {});
  }

  // --- fleet ---------------------------------------------------------------------------

  const FLEET_FILTERS = ["node", "model", "team", "state", "cause"];

  function fleetCards(fleet) {
    // The cards count and add up every GPU the filters let through, not only the page shown.
    const count = (name) => fleet.state_counts[name] || 0;
    const total = fleet.waste_usd;
    const cards = states.map((s) => card(s.name, count(s.name), !count(s.name) ? "" : s.name === "working" ? "ok" : s.waste ? "bad" : ""));
    return el("div", { class: "cards", id: "fleet-cards" }, card("GPUs", fleet.gpu_count),
      cards.map((c, i) => { c.dataset.state = states[i].name; c.title = states[i].meaning; return c; }),
      card("cost today", amount(fleet.cost_usd, fleet.held_gpu_hours)),
      el("div", { class: "card", id: "waste-today" }, el("div", { class: "k", text: "waste today" }),
        el("div", { class: "v bad", "data-usd": total === null ? "" : total.toFixed(2), "data-gpu-hours": (fleet.waste_gpu_hours ?? 0).toFixed(2), text: amount(total, fleet.waste_gpu_hours) }),
        el("div", { class: "muted small", text: total === null ? "idle + fixable (estimated), no prices" : `idle ${usd(fleet.idle_usd)} + fixable ${usd(fleet.fixable_usd)} (estimated) · ${hours((fleet.waste_gpu_hours ?? 0) * 3600)} GPU-h` })),
      fleet.lost_usd > 0 ? card("lost (hardware fault)", usd(fleet.lost_usd)) : "");
  }

  function fleetRow(g) {
    const used = g.latest ? g.latest.fb_used_bytes : undefined;
    const totalBytes = g.fb_total_bytes || (g.latest ? g.latest.fb_total_bytes : undefined);
    const current = g.state !== "lost" && g.state !== "no-data";
    const w = g.waste_usd;
    return el("tr", { "data-uuid": g.uuid, "data-state": g.state },
      td(g.node), td(String(g.index), "num"), td(g.model.replace(/^NVIDIA /, "")),
      td(el("span", {}, el("span", { class: `chip state-${g.state}`, title: stateMeaning(g.state), text: g.state }),
        current && g.hw_slowdown ? el("span", { class: "chip hw-slowdown", title: `hardware slowdown: the clocks are held down by ${(g.clock_event_reasons || []).join(", ")}`, text: "HW" }) : "")),
      td(current ? causeChip(g.cause) : el("span", { class: "muted", text: "–" })),
      td(amount(g.cost_usd, g.held_gpu_hours), "num"),
      td(w === undefined ? "–" : amount(w, g.waste_gpu_hours), "num", { "data-usd": w === null || w === undefined ? "" : w.toFixed(2), title: `${hours((g.waste_gpu_hours ?? 0) * 3600)} GPU-h wasted today` }),
      td(current ? meter(g.activity, "") : "–"),
      td(current && g.latest ? meter(g.latest.tensor_active, "tensor") : "–"),
      td(used !== undefined && totalBytes ? meter(used / totalBytes, "mem", `${gib(used)}/${gib(totalBytes)} GiB`)
        : g.memory_unknown ? el("span", { class: "muted memory-unknown", title: "the exporter sends no memory use: idle-held or idle was told by whether a job or process holds the GPU", text: "not reported" }) : "–"),
      td(g.job ? jobLink(g.job) : "", "clip"), td(ownerLink("user", g.user), "clip", { title: g.user || "" }),
      td(ownerLink("team", g.team), "clip", { title: g.team || "" }));
  }

  // The fleet page reads the worst GPUs a page at a time (the service sorts, counts and sums
  // every GPU), so ten thousand GPUs cost the browser and the service a page, not the fleet.
  const FLEET_PAGE_GPUS = 200;

  async function fleetPage() {
    page("Fleet now", "Every GPU with its state (from the cause of its latest sample), and its cost and waste today (UTC). Only working is healthy.");
    const chosen = Object.fromEntries(FLEET_FILTERS.map((k) => [k, new URLSearchParams(location.search).get(k) || ""]));
    let sortBy = "waste";
    const read = (offset) => api(`/fleet?${q({ ...chosen, sort: sortBy, limit: FLEET_PAGE_GPUS, offset })}`);
    const first = await read(0);
    // The choices are the whole fleet's, whatever the filters.
    const choices = { ...first.choices, state: states.map((x) => x.name), cause: causes.map((c) => c.name) };
    const holder = el("div", { id: "fleet-view" });
    const select = (name) => {
      const s = el("select", { id: `filter-${name}` }, el("option", { value: "", text: "all" }),
        choices[name].map((v) => el("option", { value: v, text: v, selected: v === chosen[name] })));
      s.addEventListener("change", () => {
        chosen[name] = s.value;
        history.replaceState(null, "", `/${q(chosen) ? `?${q(chosen)}` : ""}`);
        draw().catch(showError);
      });
      return el("label", {}, name, s);
    };
    app.append(el("div", { class: "filters" }, FLEET_FILTERS.map(select),
      sortSelect(sortBy, (v) => { sortBy = v; draw().catch(showError); })), holder);

    async function draw(fleet) {
      holder.dataset.loading = "1";
      fleet = fleet || await read(0);
      const headers = ["node", ["gpu", "num"], "model", "state", "cause", ["$ cost today", "num"], ["$ waste today", "num"], "activity", "tensor", "memory", "job", "user", "team"];
      const t = table(headers, fleet.gpus.map(fleetRow), { id: "fleet" });
      const body = t.querySelector("tbody");
      const count = el("p", { class: "muted", id: "fleet-count" });
      const more = el("button", { type: "button", id: "fleet-more", class: "small" });
      const shown = () => body.children.length;
      const recount = () => {
        count.textContent = `${shown()} of ${fleet.gpu_count} GPUs${fleet.gpu_count < fleet.fleet_gpu_count ? ` (${fleet.fleet_gpu_count} in the fleet)` : ""}, worst first`;
        more.hidden = shown() >= fleet.gpu_count;
        more.textContent = `show ${Math.min(FLEET_PAGE_GPUS, fleet.gpu_count - shown())} more`;
      };
      more.addEventListener("click", async () => {
        more.disabled = true;
        try {
          body.append(...(await read(shown())).gpus.map(fleetRow));
          recount();
        } catch (e) { showError(e); } finally { more.disabled = false; }
      });
      recount();
      clear(holder).append(fleetCards(fleet), count, t, more);
      delete holder.dataset.loading;
    }
    await draw(first);
  }

  // --- jobs ------------------------------------------------------------------------------

  // Lists rank by waste and can sort by cost, idle or fixable dollars (the API's sort names).
  const SORTS = [["waste", "waste"], ["cost", "cost"], ["idle", "idle"], ["fixable", "fixable"]];
  const SORT_FIELD = { waste: "waste_usd", cost: "cost_usd", idle: "idle_usd", fixable: "fixable_usd" };

  function sortSelect(current, onChange) {
    const s = el("select", { id: "sort" }, SORTS.map(([v, t]) => el("option", { value: v, text: t, selected: v === current })));
    s.addEventListener("change", () => onChange(s.value));
    return el("label", {}, "sort by $", s);
  }

  // "waste $3.00 = idle $2.00 + fixable $1.00 (estimated)" as a card.
  // What the job's GPU time is counted per: GPU-seconds per unit of its reported progress, or
  // the whole run (a fixed-size job) where it reported none (issue 46).
  function workCard(job) {
    const p = job.progress;
    const per = job.gpu_seconds_per_unit;
    const value = per === null || per === undefined ? "whole run" : `${Number(per.toPrecision(4))} GPU-s per ${job.unit_of_work}`;
    const head = p ? `${Math.round(p.last_value).toLocaleString("en-US")} ${p.unit}${p.rate_per_second ? ` · ${Number(p.rate_per_second.toPrecision(3))}/s` : ""}` : "no progress reported";
    return el("div", { class: "card", id: "job-work" }, el("div", { class: "k", text: "unit of work" }),
      el("div", { class: "v", id: "job-work-value", "data-unit": job.unit_of_work || "run", text: value }),
      el("div", { class: "muted small", title: job.unit_of_work_text || "", text: head }));
  }

  // What this run saved against the earlier run of its work that was told a fix: realised
  // beside promised, or why the two were not compared (docs/savings.md).
  function savingPanel(sv) {
    const per = sv.unit === "progress" ? "per unit of progress" : "whole run (no progress reported)";
    const fix = sv.fix_cause
      ? `fix applied: ${sv.fix_cause.replaceAll("_", " ")} ${pct(sv.fix_share_before)} → ${pct(sv.fix_share_after)} of the run`
      : "no fix told was applied (no advised cause's share fell by half)";
    const figures = sv.verdict === "not_compared" ? `not compared: ${sv.reason}`
      : `realised ${pct(sv.realised_fraction)} (${usd(sv.realised_usd)})${sv.promised_fraction === null ? "" : `, promised ${pct(sv.promised_fraction)} (${usd(sv.promised_usd)})`}; noise ±${pct(sv.noise_fraction)}: ${sv.verdict.replaceAll("_", " ")}${sv.reason ? ` (${sv.reason})` : ""}`;
    return el("div", { class: "panel", id: "job-saving", "data-verdict": sv.verdict, "data-usd": sv.realised_usd?.toFixed(2) ?? "" },
      el("p", {}, "against ", jobLink(sv.compared_with), `, ${per}`), el("p", { text: fix }), el("p", { id: "job-saving-figures", text: figures }));
  }

  function wasteCard(row, id) {
    const wasteHours = `${hours((row.waste_gpu_hours ?? 0) * 3600)} GPU-h`;
    return el("div", { class: "card" }, el("div", { class: "k", text: "waste" }),
      el("div", { class: "v bad", id, "data-usd": row.waste_usd?.toFixed(2) ?? "", "data-gpu-hours": (row.waste_gpu_hours ?? 0).toFixed(2), text: amount(row.waste_usd, row.waste_gpu_hours) }),
      el("div", { class: "muted small", text: `idle ${amount(row.idle_usd, row.idle_gpu_hours)} + fixable ${amount(row.fixable_usd, row.fixable_gpu_hours)} (estimated)${row.waste_usd === null ? "" : ` · ${wasteHours}`}` }));
  }

  // "7 days" and "30 days" are whole UTC days, today included: the service reads whole days
  // from its day sums, where a window starting mid-day reads that day GPU by GPU.
  const RANGE_START = { "24h": "-24h", "7d": "today-6d", "30d": "today-29d" };
  const rangeStart = (range) => RANGE_START[range] ?? `-${range}`;

  function rangeSelect(current, onChange) {
    const s = el("select", { id: "range" }, [["24h", "last 24 hours"], ["7d", "last 7 days (UTC, today included)"], ["30d", "last 30 days (UTC, today included)"]]
      .map(([v, t]) => el("option", { value: v, text: t, selected: v === current })));
    s.addEventListener("change", () => onChange(s.value));
    return el("label", {}, "range", s);
  }

  // A page's filters live in its URL (replaced, not pushed), so a reload keeps them and a link
  // shares them.
  function keepInUrl(path, params) {
    const query = q(params);
    history.replaceState(null, "", `${path}${query ? `?${query}` : ""}`);
  }

  const urlParam = (name) => new URLSearchParams(location.search).get(name);

  // The jobs page reads a page of the worst jobs at a time; the service ranks every job.
  const JOBS_PAGE = 100;

  async function jobsPage(since = urlParam("since") || "7d", sort = urlParam("sort") || "waste") {
    keepInUrl("/jobs", { ...(since === "7d" ? {} : { since }), ...(sort === "waste" ? {} : { sort }) });
    page("Jobs", "Jobs that held GPUs in the range, ranked by waste (idle + fixable dollars), with the cause whose fix saves the most.");
    app.append(el("div", { class: "filters" }, rangeSelect(since, (v) => jobsPage(v, sort).catch(showError)),
      sortSelect(sort, (v) => jobsPage(since, v).catch(showError))));
    const read = (offset) => api(`/jobs?${q({ start: rangeStart(since), sort, limit: JOBS_PAGE, offset })}`, { counted: true });
    const first = await read(0);
    const row = (j) => el("tr", { "data-job": j.id },
      td(jobLink(j.id)), td(ownerLink("user", j.user), "clip", { title: j.user || "" }), td(ownerLink("team", j.team), "clip"), td(j.project || "", "clip"),
      td(when(j.started_at)), td(j.ended_at ? when(j.ended_at) : "running"),
      td(usd(j.cost_usd), "num"), td(usd(j.waste_usd), "num", { "data-usd": j.waste_usd?.toFixed(2) ?? "" }),
      td(usd(j.idle_usd), "num"), td(usd(j.fixable_usd), "num"),
      td(pct(j.efficiency), "num"), td(causeChip(j.top_cause)),
      td(labelsText(j.labels), "mono clip", { title: labelsText(j.labels) }));
    if (!first.rows.length) {
      app.append(el("p", { class: "muted", text: "No jobs in this range." }));
      return;
    }
    const t = table(["job", "user", "team", "project", "started", "ended", ["cost", "num"], ["waste", "num"], ["idle", "num"], ["fixable", "num"], ["efficiency", "num"], "top cause", "labels"], first.rows.map(row), { id: "jobs" });
    const body = t.querySelector("tbody");
    const count = el("p", { class: "muted", id: "jobs-count" });
    const more = el("button", { type: "button", id: "jobs-more", class: "small" });
    let total = first.total;
    const recount = () => {
      count.textContent = `${body.children.length} of ${total} jobs, worst first, from ${when(first.start)} up to ${when(first.end)}`;
      more.hidden = body.children.length >= total;
      more.textContent = `show ${Math.min(JOBS_PAGE, total - body.children.length)} more`;
    };
    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        const next = await read(body.children.length);
        body.append(...next.rows.map(row));
        total = next.total;
        recount();
      } catch (e) { showError(e); } finally { more.disabled = false; }
    });
    recount();
    app.append(count, t, more);
  }

  // --- one job ---------------------------------------------------------------------------

  // Time by cause (the default), or waste by cause ({ by: "waste" }): a cause with no waste
  // (compute_tensor, or an inefficient cause whose fix saves nothing) has no part in the latter.
  function causeBar(causesOf, id, { by = "time" } = {}) {
    const size = by === "waste" ? (c) => c.waste_usd || 0 : (c) => c.seconds;
    const entries = Object.entries(causesOf || {}).filter(([, c]) => size(c) > 0)
      .sort((a, b) => size(b[1]) - size(a[1]));
    const total = entries.reduce((s, [, c]) => s + size(c), 0) || 1;
    const bar = el("div", { class: "causebar", id });
    for (const [name, c] of entries) {
      const seg = el("span", { class: `c-${name}`, title: `${name}: ${hours(c.seconds)} GPU-h, cost ${usd(c.usd)}, waste ${usd(c.waste_usd)}` });
      seg.style.width = `${(size(c) / total) * 100}%`;
      bar.append(seg);
    }
    const legend = el("div", { class: "legend" }, entries.map(([name, c]) => el("span", { class: "item", "data-cause": name },
      el("span", { class: `dot c-${name}` }), `${name.replaceAll("_", " ")}: ${hours(c.seconds)} GPU-h · ${usd(c.usd)} · waste ${usd(c.waste_usd)} · ${pct(size(c) / total)}${by === "waste" ? " of the waste" : ""}`)));
    const none = by === "waste" ? "No waste in the range." : "No covered time yet.";
    return [bar, entries.length ? legend : el("p", { class: "muted", text: none })];
  }

  function alignSeries(seriesList) {
    const xs = [...new Set(seriesList.flatMap((s) => s.points.map((p) => Date.parse(p.ts) / 1000)))].sort((a, b) => a - b);
    const ys = seriesList.map((s) => {
      const byTs = new Map(s.points.map((p) => [Date.parse(p.ts) / 1000, p.avg]));
      return xs.map((x) => (byTs.has(x) ? byTs.get(x) : null));
    });
    return [xs, ...ys];
  }

  // Chart times read like the rest of the console: UTC, 24-hour, ISO order.
  const isoTime = (ts) => new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
  const timeTicks = (u, splits) => {
    const days = new Set(splits.map((ts) => new Date(ts * 1000).toISOString().slice(0, 10))).size;
    const labels = splits.map((ts) => {
      const iso = new Date(ts * 1000).toISOString();
      return days > 1 ? `${iso.slice(5, 10)} ${iso.slice(11, 16)}Z` : `${iso.slice(11, 16)}Z`;
    });
    u.root.parentNode.dataset.timeTicks = JSON.stringify(labels);
    return labels;
  };

  // Tick labels with as many decimals as the step between ticks needs, so no two read alike.
  function tickLabels(splits, suffix) {
    const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
    for (let d = Math.max(0, Math.ceil(-Math.log10(step || 1))); d <= 6; d += 1) {
      const labels = splits.map((v) => `${v.toFixed(d)}${suffix}`);
      if (new Set(labels).size === labels.length) return labels;
    }
    return splits.map((v) => `${v}${suffix}`);
  }

  const measure = document.createElement("canvas").getContext("2d");

  // A bytes-per-second scale in the prefix its largest value needs.
  function rateUnit(max) {
    return [[1e9, "GB/s"], [1e6, "MB/s"], [1e3, "kB/s"]].find(([f]) => max >= f) || [1, "B/s"];
  }

  // One panel per unit: every line in it shares its one axis, which starts at zero and leaves
  // headroom over the largest value, so a constant line sits below the top, not on the frame.
  function chart(target, { title, suffix, xs, lines, top }) {
    const max = Math.max(0, ...lines.flatMap((l) => l.values.filter((v) => v !== null)));
    const yRange = () => [0, top ?? (max > 0 ? max * 1.25 : 1)];
    // The drawn labels are kept on the panel too: the canvas holds them only as pixels.
    const yValues = (u, splits) => { const labels = tickLabels(splits, suffix); target.dataset.ticks = JSON.stringify(labels); return labels; };
    const ySize = (u, values) => {
      measure.font = "12px system-ui, sans-serif";
      return 18 + Math.ceil(Math.max(24, ...(values || []).map((v) => measure.measureText(v).width)));
    };
    const width = Math.max(260, target.clientWidth - 32);
    const opts = {
      title, width, height: 190,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"), // eslint-disable-line no-undef
      scales: { x: { time: true }, y: { range: yRange } },
      series: [{ label: "time (UTC)", value: (u, ts) => (ts == null ? "–" : isoTime(ts)) },
        ...lines.map((l) => ({ label: l.label, stroke: l.color, width: l.width || 1.75, dash: l.dash, value: (u, v) => (v == null ? "–" : `${Number(v.toPrecision(3))}${suffix}`) }))],
      axes: [{ values: timeTicks, space: 70 }, { values: yValues, size: ySize }],
      legend: { live: true },
    };
    // eslint-disable-next-line no-undef
    return new uPlot(opts, [xs, ...lines.map((l) => l.values)], target);
  }

  // A panel for one GPU's lines of one unit, or a sentence saying why there are none.
  function seriesPanel(holder, spec) {
    const panel = el("div", { class: "panel chart", "data-chart": spec.unit });
    holder.append(panel);
    if (!spec.xs.length || spec.lines.every((l) => l.values.every((v) => v === null))) {
      panel.append(el("p", { class: "muted nodata", text: `${spec.title}: no samples in the job's window.` }));
      return;
    }
    chart(panel, spec);
  }

  const SERIES_METRICS = ["activity", "tensor_active", "dram_active", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "fb_used_bytes"];

  function gpuCharts(holder, byMetric) {
    const grid = el("div", { class: "grid3" });
    holder.append(grid);
    const [rx, ...ratio] = alignSeries(["activity", "tensor_active", "dram_active"].map((m) => byMetric[m]));
    seriesPanel(grid, { title: "activity, tensor, DRAM (%)", unit: "ratio", suffix: "%", xs: rx, top: 100, lines: [
      { label: "activity", color: causeColor("compute_no_tensor"), values: ratio[0].map((v) => (v == null ? null : v * 100)), width: 2 },
      { label: "tensor", color: causeColor("compute_tensor"), values: ratio[1].map((v) => (v == null ? null : v * 100)), dash: [8, 4] },
      { label: "DRAM", color: causeColor("memory_bound"), values: ratio[2].map((v) => (v == null ? null : v * 100)), dash: [2, 3] },
    ] });
    const [px, tx, rxb] = alignSeries([byMetric.pcie_tx_bytes_per_second, byMetric.pcie_rx_bytes_per_second]);
    const [factor, rate] = rateUnit(Math.max(0, ...tx, ...rxb));
    const scaled = (vs) => vs.map((v) => (v == null ? null : v / factor));
    seriesPanel(grid, { title: `PCIe (${rate})`, unit: "bytes_per_second", suffix: ` ${rate}`, xs: px, lines: [
      { label: "PCIe tx", color: causeColor("transfer_bound"), values: scaled(tx), width: 2 },
      { label: "PCIe rx", color: causeColor("launch_bound"), values: scaled(rxb), dash: [8, 4] },
    ] });
    const [mx, fb] = alignSeries([byMetric.fb_used_bytes]);
    seriesPanel(grid, { title: "memory used (GiB)", unit: "bytes", suffix: " GiB", xs: mx, lines: [
      { label: "memory", color: causeColor("idle_held"), values: fb.map((v) => (v == null ? null : v / GIB)), width: 2 },
    ] });
  }

  // All of a job's series in one read (the service bounds concurrent expensive reads, so one
  // read per GPU and metric turned the page's own reads away). A read still refused after the
  // retries says so, with a button to ask again, instead of drawing empty lines.
  async function jobCharts(job, uuids) {
    const box = el("div", { id: "job-series" });
    app.append(box);
    const end = job.ended_at || new Date().toISOString();
    const params = new URLSearchParams(SERIES_METRICS.map((m) => ["metric", m]));
    if (uuids.length <= 16) params.set("job", job.id);
    else { for (const u of uuids.slice(0, 16)) params.append("gpu", u); params.set("start", job.started_at); params.set("end", end); }
    box.dataset.loading = "1";
    let got;
    try {
      got = await api(`/gpus/series?${params}`);
    } catch (err) {
      const busy = err.status === 503;
      clear(box).append(el("div", { class: "panel busy", role: "alert", "data-status": err.status || "" },
        el("strong", { text: busy ? "Charts busy, retry: " : "Charts could not load: " }),
        busy ? "the service is answering as many chart reads as it may; ask again in a moment. " : `${err.message || err} `,
        el("button", { type: "button", class: "small", id: "series-retry", text: "Retry", onclick: () => { box.remove(); jobCharts(job, uuids).catch(showError); } })));
      delete box.dataset.loading;
      return;
    }
    const perGpu = new Map((job.per_gpu || []).map((g) => [g.gpu_uuid, g]));
    for (const uuid of uuids.slice(0, 16)) {
      const g = perGpu.get(uuid);
      const node = job.gpus.find((x) => x.gpu_uuid === uuid).node;
      const holder = el("div", { class: "gpu", "data-uuid": uuid });
      box.append(el("div", { class: "gpuhead" }, el("strong", { text: node }), el("span", { class: "mono muted", text: uuid }),
        g ? el("span", { class: "muted", text: `cost ${usd(g.cost_usd)} · waste ${usd(g.waste_usd)} (idle ${usd(g.idle_usd)} + fixable ${usd(g.fixable_usd)}) · efficiency ${pct(g.efficiency)}` }) : ""), holder);
      if (g) holder.append(el("div", {}, causeBar(g.causes)[0]));
      const byMetric = Object.fromEntries(got.series.filter((x) => x.gpu_uuid === uuid).map((x) => [x.metric, x]));
      gpuCharts(holder, byMetric);
    }
    if (uuids.length > 16) box.append(el("p", { class: "muted", text: `${uuids.length - 16} more GPUs not drawn.` }));
    delete box.dataset.loading;
  }

  async function jobPage(id) {
    const job = await api(`/jobs/${encodeURIComponent(id)}`);
    const s = job.summary;
    const who = ["user", "team", "project"].filter((k) => job[k]).map((k) => `${k} ${job[k]}`).join(" · ");
    page(`Job ${job.id}`, `${who || "no owner recorded"} · ${JOB_SOURCE_TEXT[job.source] || job.source} · ${when(job.started_at)} to ${job.ended_at ? when(job.ended_at) : "now (running)"}`);
    const labels = Object.entries(job.labels || {});
    if (labels.length) {
      app.append(el("p", { id: "job-labels" }, "labels: ", labels.map(([k, v]) => el("span", { class: "chip mono", text: `${k}=${v}` })), ""));
    }
    app.append(el("div", { class: "cards", id: "job-cards" },
      card("cost", amount(s.cost_usd, s.held_gpu_hours)), wasteCard(s, "job-waste"),
      s.lost_seconds > 0 ? card("lost (GPU fell off the bus)", usd(s.lost_usd)) : "",
      s.nodata_seconds > 0 ? card("no data", usd(s.nodata_usd)) : "",
      card("efficiency (activity)", pct(s.efficiency)),
      card("GPU-hours", hours(s.allocated_seconds)), card("GPUs", new Set(job.gpus.map((g) => g.gpu_uuid)).size), workCard(job)));

    const faults = job.faults || [];
    if (faults.length) {
      app.append(el("div", { class: "fault", id: "job-faults", role: "alert" }, el("strong", { text: "Hardware fault" }),
        el("ul", { class: "recs" }, faults.map((f) => el("li", { "data-kind": f.kind, "data-xid": f.xid ?? "" },
          `${f.node} GPU ${f.gpu_index}: `, f.kind === "xid"
            ? `hardware XID ${f.xid} at ${when(f.at)}`
            : `fell off the bus (last sample ${when(f.at)}, reported lost ${when(f.lost_at)}); held lost ${hours(f.lost_seconds)} GPU-h, ${usd(f.lost_usd)}`)))));
    }
    app.append(el("h2", { text: "Time by cause" }), el("div", { class: "panel" }, causeBar(s.causes, "job-causes")));

    const recs = [];
    const fixes = job.recommendations || [];
    for (const r of fixes) {
      const what = r.kind === "cause" && r.cause ? `${r.cause.replaceAll("_", " ")}: ` : { mig: "MIG slice: ", fewer_gpus: "fewer GPUs: ", pool: "idle capacity: " }[r.kind] || "";
      // The percentage is of the base the fix names (a cause's dollars, what the fixes above leave).
      const base = r.base || `${hours(r.seconds)} GPU-h`;
      // A cause whose promises came out otherwise on the runs that applied them says so (issue 46).
      const calibrated = r.calibration_factor === null || r.calibration_factor === undefined ? ""
        : `; calibrated ${usd(r.calibrated_saving_usd)} (x${r.calibration_factor.toFixed(2)}, from the runs that applied it)`;
      recs.push(el("li", { "data-kind": r.kind },
        el("strong", { text: what }), r.action,
        el("span", { class: "muted", text: ` (saves ${usd(r.saving_usd)}, ${pct(r.saving_fraction)} of ${base}; ${r.assumption}${calibrated})` })));
    }
    const top = s.top_cause;
    // A fixed run is never told the fix it applies (docs/savings.md): its cause's meaning only.
    const applied = job.savings && job.savings.fix_applied && job.savings.fix_cause === top;
    if (!fixes.length && top) recs.push(el("li", { id: "job-top-cause" }, el("strong", { text: `Top cause ${top.replaceAll("_", " ")}: ` }),
      applied ? `${(causes.find((x) => x.name === top) || {}).meaning || ""}; its fix is already applied by this run` : causeMeaning(top)));
    const savings = job.savings_usd === null || job.savings_usd === undefined ? "" : ` · together they save ${usd(job.savings_usd)}`;
    app.append(el("h2", { text: `Recommendations${savings}` }), el("div", { class: "panel", id: "job-recs" },
      recs.length ? el("ul", { class: "recs" }, recs) : el("p", { class: "muted", text: "Nothing to recommend: no waste cause dominates." })));
    for (const w of job.warnings || []) app.append(el("p", { class: "note", text: w }));
    if (job.savings) app.append(el("h2", { text: "Proven saving" }), savingPanel(job.savings));

    const alerts = await api(`/alerts?${q({ job: job.id })}`);
    app.append(el("h2", { text: "Alerts" }), alerts.length ? alertsTable(alerts) : el("p", { class: "muted", text: "No alerts for this job." }));
    const steps = await api(`/actions?${q({ job: job.id })}`);
    app.append(el("h2", { text: "Actions" }), steps.length ? actionsTable(steps, { withJob: false })
      : el("p", { class: "muted", id: "no-job-actions", text: "No ladder step has touched this job." }));
    const sent = await api(`/notices?${q({ job: job.id })}`);
    app.append(el("h2", { text: "Notices" }), sent.length ? noticesTable(sent, "job-notices")
      : el("p", { class: "muted", id: "no-job-notices", text: "No notice was sent about this job." }));

    app.append(el("h2", { text: "Per GPU" }));
    await jobCharts(job, [...new Set(job.gpus.map((g) => g.gpu_uuid))]);
  }

  // --- costs -----------------------------------------------------------------------------

  const COSTS_DEFAULT = { group_by: "team", start: "today-6d", end: "now", sort: "waste" };

  const COSTS_ROWS = 500; // rows a costs table shows: a month by job can have tens of thousands

  async function costsPage(state = Object.fromEntries(Object.entries(COSTS_DEFAULT).map(([k, v]) => [k, urlParam(k) || v]))) {
    keepInUrl("/costs", Object.fromEntries(Object.entries(state).filter(([k, v]) => v !== COSTS_DEFAULT[k])));
    page("Costs", "Cost and waste per group over a range: waste = idle (nothing ran) + fixable (what the causes' fixes would save, estimated).");
    // label:<key> groups by any job label: the select says "label", the key is typed beside it.
    const byLabel = state.group_by.startsWith("label:");
    const groupSel = el("select", { id: "group-by" }, ["team", "user", "project", "namespace", "label", "node", "gpu_model", "job"]
      .map((g) => el("option", { value: g, text: g.replace("_", " "), selected: g === (byLabel ? "label" : state.group_by) })));
    const labelIn = el("input", { id: "label-key", value: byLabel ? state.group_by.slice(6) : "", size: 24, placeholder: "app.kubernetes.io/name", title: "the job label to group by" });
    const groupBy = () => (groupSel.value === "label" ? `label:${labelIn.value.trim()}` : groupSel.value);
    const startIn = el("input", { id: "start", value: state.start, size: 22, title: "RFC 3339, a date, now, -24h or today-6d" });
    const endIn = el("input", { id: "end", value: state.end, size: 22 });
    const sortSel = sortSelect(state.sort || "waste", () => apply());
    const apply = () => costsPage({ group_by: groupBy(), start: startIn.value.trim(), end: endIn.value.trim(), sort: sortSel.querySelector("select").value }).catch(showError);
    const preset = (label, start) => el("button", { type: "button", class: "small", onclick: () => { startIn.value = start; endIn.value = "now"; apply(); }, text: label });
    const form = el("form", { class: "filters" }, el("label", {}, "group by", groupSel),
      el("label", { id: "label-key-field", hidden: groupSel.value !== "label" }, "label", labelIn), el("label", {}, "start", startIn),
      el("label", {}, "end", endIn), sortSel, el("button", { type: "submit", text: "Show" }), el("span", { id: "cost-presets", class: "presets" }, preset("24 h", "-24h"), preset("7 days", "today-6d"), preset("30 days", "today-29d")));
    form.addEventListener("submit", (e) => { e.preventDefault(); apply(); });
    groupSel.addEventListener("change", () => {
      if (groupSel.value !== "label" || labelIn.value.trim()) apply();
      else { document.getElementById("label-key-field").hidden = false; labelIn.focus(); }
    });
    app.append(form);
    const params = { group_by: state.group_by, start: state.start, end: state.end, sort: state.sort || "waste" };
    const report = await api(`/reports/cost?${q({ ...params, limit: COSTS_ROWS })}`);
    const t = report.totals;
    app.append(el("p", { class: "muted", text: `${when(report.start)} to ${when(report.end)} · prices: ${report.price_source}` }));
    for (const w of report.warnings || []) app.append(el("p", { class: "note", text: w }));
    app.append(el("div", { class: "cards", id: "cost-totals" }, card("cost", amount(t.cost_usd, t.held_gpu_hours)),
      wasteCard(t, "total-waste"),
      t.lost_seconds > 0 ? card("lost (hardware fault)", usd(t.lost_usd)) : "",
      card("efficiency (activity)", pct(t.efficiency)), card("GPU-hours", hours(t.held_seconds)),
      el("div", { class: "card" }, el("div", { class: "k", text: "download" }),
        el("a", { class: "button", id: "csv", href: `/api/v1/reports/cost?${q({ ...params, format: "csv" })}`, download: `gpuwarden-cost-${state.group_by}.csv`, text: "CSV" }))));

    const top = report.rows.slice(0, 20);
    const max = Math.max(...top.map((r) => r.cost_usd || 0), 0.01);
    const chartRows = top.flatMap((r) => {
      const cost = el("span", { class: "cost" });
      cost.style.width = `${((r.cost_usd || 0) / max) * 100}%`;
      const waste = el("span", { class: "waste" });
      waste.style.width = `${((r.waste_usd || 0) / max) * 100}%`;
      return [el("span", { class: "label", title: r.key, text: r.key }), el("span", { class: "track" }, cost, waste),
        el("span", { class: "num", text: `${usd(r.waste_usd)} of ${usd(r.cost_usd)}` })];
    });
    app.append(el("h2", { text: `Waste of total cost per ${state.group_by.replace("_", " ")}` }),
      el("div", { class: "panel" }, top.length ? el("div", { class: "hbar", id: "cost-chart" }, chartRows) : el("p", { class: "muted", text: "No data in this range." }),
        el("p", { class: "legend muted" }, el("span", { class: "item" }, el("span", { class: "dot c-idle_held" }), "waste (idle + fixable)"),
          el("span", { class: "item" }, el("span", { class: "dot c-nodata" }), "total cost"))));
    const trs = report.rows.map((r) => el("tr", { "data-key": r.key },
      td(state.group_by === "job" && r.key !== "__unallocated__" ? jobLink(r.key) : r.key), td(String(r.gpus), "num"), td(String(r.jobs), "num"),
      td(hours(r.held_seconds), "num"), td(amount(r.cost_usd, r.held_gpu_hours), "num"),
      td(amount(r.waste_usd, r.waste_gpu_hours), "num", { "data-usd": r.waste_usd?.toFixed(2) ?? "", title: `${hours(r.waste_gpu_hours * 3600)} GPU-h wasted` }),
      td(hours(r.waste_gpu_hours * 3600), "num"), td(amount(r.idle_usd, r.idle_gpu_hours), "num"), td(amount(r.fixable_usd, r.fixable_gpu_hours), "num"),
      td(pct(r.efficiency), "num"), td(causeChip(r.top_cause))));
    const more = report.row_count - report.rows.length;
    app.append(el("h2", { text: "Rows" }));
    if (more > 0) app.append(el("p", { class: "muted", id: "costs-more", text: `The first ${report.rows.length} of ${report.row_count} rows; the totals and the CSV cover all of them.` }));
    app.append(table([state.group_by.replace("_", " "), ["GPUs", "num"], ["jobs", "num"], ["GPU-h", "num"], ["cost", "num"], ["waste", "num"], ["waste GPU-h", "num"], ["idle", "num"], ["fixable", "num"], ["efficiency", "num"], "top cause"], trs, { id: "costs" }));
  }


  // --- a user's or team's own page: their GPUs now, their jobs and their waste -------------

  const OWNER_DEFAULT = { start: "today-6d", end: "now" };

  function gpuNowRow(g) {
    return el("tr", { "data-gpu": g.uuid },
      td(g.node), td(String(g.index), "num"), td(g.model.replace(/^NVIDIA /, "")), td(g.job ? jobLink(g.job) : ""),
      td(el("span", { class: `chip state-${g.state}`, title: stateMeaning(g.state), text: g.state })),
      td(causeChip(g.cause)), td(meter(g.activity, "")), td(amount(g.cost_usd, g.held_gpu_hours), "num"), td(amount(g.waste_usd, g.waste_gpu_hours), "num"));
  }

  async function ownerPage(kind, name, state = Object.fromEntries(Object.entries(OWNER_DEFAULT).map(([k, v]) => [k, urlParam(k) || v]))) {
    const path = `/${kind}s/${encodeURIComponent(name)}`;
    keepInUrl(path, Object.fromEntries(Object.entries(state).filter(([k, v]) => v !== OWNER_DEFAULT[k])));
    document.title = `${kind} ${name} · GPU Warden`;
    page(`${kind === "user" ? "User" : "Team"} ${name}`, `${kind === "user" ? "Their" : "The team's"} GPUs now, jobs and waste over the range: waste = idle (nothing ran) + fixable (what the causes' fixes would save, estimated). The ${kind}'s periodic report links here.`);
    const startIn = el("input", { id: "start", value: state.start, size: 22, title: "RFC 3339, a date, now, -24h or today-6d" });
    const endIn = el("input", { id: "end", value: state.end, size: 22 });
    const apply = () => ownerPage(kind, name, { start: startIn.value.trim(), end: endIn.value.trim() }).catch(showError);
    const preset = (label, start) => el("button", { type: "button", class: "small", onclick: () => { startIn.value = start; endIn.value = "now"; apply(); }, text: label });
    const form = el("form", { class: "filters", id: "owner-range" }, el("label", {}, "start", startIn), el("label", {}, "end", endIn),
      el("button", { type: "submit", text: "Show" }), el("span", { id: "owner-presets", class: "presets" }, preset("24 h", "-24h"), preset("7 days", "today-6d"), preset("30 days", "today-29d")));
    form.addEventListener("submit", (e) => { e.preventDefault(); apply(); });
    app.append(form);
    const [report, fleet, optOuts, notices] = await Promise.all([
      api(`/reports/cost?${q({ group_by: "job", [kind]: name, start: state.start, end: state.end, sort: "cost" })}`),
      // The GPUs now are a fleet view: a person who sees only their own jobs gets none.
      session.fleet === false ? null : api(`/fleet?${q({ [kind]: name })}`),
      api("/reports/opt-outs"),
      api(`/notices?${q({ [kind]: name, start: state.start, end: state.end, limit: 50 })}`),
    ]);
    const t = report.totals;
    app.append(el("p", { class: "muted", id: "owner-window", text: `${when(report.start)} to ${when(report.end)} · prices: ${report.price_source}` }));
    for (const w of report.warnings || []) app.append(el("p", { class: "note", text: w }));
    app.append(el("div", { class: "cards", id: "owner-cards" },
      el("div", { class: "card" }, el("div", { class: "k", text: "cost" }), el("div", { class: "v", id: "owner-cost", "data-usd": t.cost_usd?.toFixed(2) ?? "", text: amount(t.cost_usd, t.held_gpu_hours) })),
      wasteCard(t, "owner-waste"), card("GPU-hours", hours(t.held_seconds)), card("jobs", t.jobs), card("efficiency (activity)", pct(t.efficiency)),
      // Proven savings of the range: the fixes its runs applied, measured (docs/savings.md).
      t.realised_usd ? el("div", { class: "card", id: "owner-saved" }, el("div", { class: "k", text: "saved by fixes (measured)" }),
        el("div", { class: "v", "data-usd": t.realised_usd.toFixed(2), text: usd(t.realised_usd) }),
        el("div", { class: "muted small", text: `${usd(t.promised_usd)} promised` })) : ""));
    app.append(el("h2", { text: "Waste by cause" }), el("div", { class: "panel" }, causeBar(t.causes, "owner-causes", { by: "waste" })));

    const mine = fleet ? fleet.gpus.filter((g) => g[kind] === name) : [];
    if (fleet) app.append(el("h2", { text: `GPUs now (${mine.length})` }), mine.length
      ? table(["node", ["GPU", "num"], "model", "job", "state", "cause", "activity", ["cost today", "num"], ["waste today", "num"]], mine.map(gpuNowRow), { id: "owner-gpus" })
      : el("p", { class: "muted", id: "owner-gpus-none", text: `No GPU is held by a job of this ${kind} now.` }));

    const jobs = report.rows.filter((r) => r.key !== "__unallocated__");
    const other = kind === "user" ? "team" : "user";
    const trs = jobs.map((r) => {
      const fix = (r.fixes || [])[0];
      return el("tr", { "data-job": r.key },
        td(jobLink(r.key)), td(ownerLink(other, r[other], location.search), "clip"), td(hours(r.held_seconds), "num"),
        td(amount(r.cost_usd, r.held_gpu_hours), "num"), td(amount(r.waste_usd, r.waste_gpu_hours), "num", { "data-usd": r.waste_usd?.toFixed(2) ?? "", title: `${hours(r.waste_gpu_hours * 3600)} GPU-h wasted` }),
        td(amount(r.idle_usd, r.idle_gpu_hours), "num"), td(amount(r.fixable_usd, r.fixable_gpu_hours), "num"), td(causeChip(r.top_cause)),
        td(fix ? `${fix.action} (saves ${usd(fix.saving_usd)})` : "", "wrap"));
    });
    app.append(el("h2", { text: "Jobs, costliest first" }), jobs.length
      ? table(["job", other, ["GPU-h", "num"], ["cost", "num"], ["waste", "num"], ["idle", "num"], ["fixable", "num"], "top cause", "top fix"], trs, { id: "owner-jobs" })
      : el("p", { class: "muted", id: "owner-jobs-none", text: `No job of this ${kind} in the range.` }));
    app.append(el("h2", { text: "Periodic report" }), reportOptPanel(kind, name, optOuts, () => ownerPage(kind, name, state)));
    app.append(el("h2", { text: `Notices in the range (${notices.length}${notices.length === 50 ? ", the newest" : ""})` }), notices.length
      ? noticesTable(notices, "owner-notices")
      : el("p", { class: "muted", id: "owner-notices-none", text: `Nothing was sent to this ${kind} in the range.` }));
  }

  // --- alerts and silences ---------------------------------------------------------------

  function alertScope(labels) {
    const l = labels || {};
    const parts = [];
    if (l.node) parts.push(l.gpu_index !== undefined && l.gpu_index !== "" ? `${l.node} GPU ${l.gpu_index}` : l.node);
    const owners = [l.user && ownerLink("user", l.user), l.team && ownerLink("team", l.team)].filter(Boolean);
    return el("span", { title: labelsText(l) }, l.job_id ? [jobLink(l.job_id), parts.length || owners.length ? " · " : ""] : "", parts.join(" · "),
      owners.flatMap((o, i) => [i || parts.length ? " · " : "", o]));
  }

  const STATE_ORDER = { firing: 0, pending: 1, inactive: 2, resolved: 3 };

  function alertsTable(alerts) {
    const sorted = [...alerts].sort((a, b) => (STATE_ORDER[a.state] ?? 9) - (STATE_ORDER[b.state] ?? 9)
      || b.active_since.localeCompare(a.active_since));
    const trs = sorted.map((a) => el("tr", { "data-alert": a.id, id: `alert-${a.id}` },
      td(el("span", { class: `chip st-${a.state}`, text: a.state })), td(a.policy), td(el("span", { class: `chip sev-${a.severity}`, text: a.severity })),
      td(alertScope(a.labels), "wrap scope"), td(`${a.value === null ? "–" : a.value.toFixed(3)} / ${a.threshold}`, "num"),
      td(when(a.active_since)), td(when(a.fired_at)), td(when(a.resolved_at)),
      td([a.silenced ? "silenced" : "", a.suppressed ? "suppressed" : "", a.stale ? "stale" : ""].filter(Boolean).join(", "), "wrap"),
      td(el("details", {}, el("summary", { text: `${a.history.length} change${a.history.length === 1 ? "" : "s"}` }),
        el("ul", { class: "recs mono" }, a.history.map((h) => el("li", { text: `${when(h.ts)} ${h.from_state} → ${h.to_state}${h.value === null ? "" : ` (${h.value.toFixed(3)})`}` })),
          el("li", { class: "muted", text: labelsText(a.labels) }))))));
    return table(["state", "policy", "severity", "scope", ["value / threshold", "num"], "since", "fired", "resolved", "flags", "history"], trs, { id: "alerts" });
  }

  async function alertsPage() {
    page("Alerts", "Alerts of the policies, firing first, with their history; silences mute notifications of matching alerts.");
    const [alerts, silences] = await Promise.all([api("/alerts?limit=500"), api("/silences")]);
    const firing = alerts.filter((a) => a.state === "firing").length;
    app.append(el("div", { class: "cards" }, card("firing", firing, firing ? "bad" : ""), card("pending", alerts.filter((a) => a.state === "pending").length),
      card("resolved", alerts.filter((a) => a.state === "resolved").length), card("active silences", silences.filter((s) => s.status === "active").length)));
    app.append(alerts.length ? alertsTable(alerts) : el("p", { class: "muted", text: "No alerts yet." }));
    // An alert's link (/alerts#alert-N, as notifications send it) marks and shows its row.
    const target = location.hash.startsWith("#alert-") && document.getElementById(location.hash.slice(1));
    if (target) { target.classList.add("target"); target.scrollIntoView({ block: "center" }); }

    app.append(el("h2", { text: "Silences" }));
    const admin = session && session.role === "admin";
    if (admin) app.append(silenceForm());
    else app.append(el("p", { class: "muted", text: "Admins can create and expire silences." }));
    const trs = silences.map((s) => el("tr", { "data-silence": s.id },
      td(el("span", { class: `chip st-${s.status}`, text: s.status })), td(labelsText(s.matchers), "mono wrap"), td(when(s.starts_at)), td(when(s.ends_at)),
      td(s.comment, "wrap"), td(s.created_by || ""),
      td(admin && s.status !== "expired" ? el("button", { type: "button", class: "small danger", text: "Expire", onclick: async () => {
        try { await api(`/silences/${s.id}`, { method: "DELETE" }); await alertsPage(); } catch (err) { showError(err); }
      } }) : "")));
    app.append(silences.length ? table(["status", "matchers", "starts", "ends", "comment", "by", ""], trs, { id: "silences" })
      : el("p", { class: "muted", text: "No silences." }));
  }

  function silenceForm() {
    const matchers = el("input", { id: "silence-matchers", size: 36, placeholder: "node=gpu-node-1, policy=gpu-idle*", required: true });
    const duration = el("select", { id: "silence-hours" }, [["1", "1 hour"], ["4", "4 hours"], ["24", "1 day"], ["168", "7 days"]]
      .map(([v, t]) => el("option", { value: v, text: t })));
    const comment = el("input", { id: "silence-comment", size: 30, placeholder: "why", required: true });
    const error = el("span", { class: "err" });
    const form = el("form", { class: "inline panel", id: "silence-form" }, el("label", {}, "matchers (label=pattern, …)", matchers),
      el("label", {}, "for", duration), el("label", {}, "comment", comment), el("button", { type: "submit", text: "Create silence" }), error);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const pairs = matchers.value.split(",").map((p) => p.trim()).filter(Boolean).map((p) => p.split("=").map((x) => x.trim()));
      if (!pairs.length || pairs.some((p) => p.length !== 2 || !p[0] || !p[1])) { error.textContent = "matchers: write label=pattern, separated by commas"; return; }
      try {
        await api("/silences", { method: "POST", body: {
          matchers: Object.fromEntries(pairs), comment: comment.value,
          ends_at: new Date(Date.now() + Number(duration.value) * 3600e3).toISOString(),
          created_by: session.user ? `person:${session.user}` : session.token_name || `token ${session.token_prefix}`,
        } });
        await alertsPage();
      } catch (err) { error.textContent = err.message; }
    });
    return form;
  }

  // --- actions (the ladders' audit log) ---------------------------------------------------

  // The audit log's outcomes (service.vocabulary.ACTION_OUTCOMES; a unit test keeps them equal).
  const ACTION_OUTCOMES = ["would", "warned", "reclaimed", "skipped", "failed", "gone", "held"];
  const ACTION_FILTERS = ["policy", "outcome", "user", "team", "job", "since"];
  const OUTCOME_CLASS = { would: "st-pending", warned: "st-pending", reclaimed: "st-firing", failed: "st-firing", skipped: "st-expired", gone: "st-expired" };

  // What triggered a step: the policy's value against its threshold, since when, the waste then.
  function triggerText(a) {
    const parts = [];
    if (a.value !== null && a.value !== undefined) parts.push(`${+a.value.toFixed(3)}${a.threshold === null || a.threshold === undefined ? "" : ` vs ${a.threshold}`}`);
    if (a.since) parts.push(`since ${when(a.since)}`);
    if (a.waste_usd !== null && a.waste_usd !== undefined) parts.push(`waste ${usd(a.waste_usd)}`);
    return parts.join(" · ");
  }

  // One step per row, newest first: when, what, outcome, why and whether it was a dry run.
  function actionsTable(actions, { withJob = true } = {}) {
    const trs = actions.map((a) => el("tr", { "data-action": a.id, "data-outcome": a.outcome, "data-dry-run": a.dry_run ? "1" : "0" },
      td(when(a.at)), td(a.policy), withJob ? td(jobLink(a.job_id), "clip") : "", withJob ? td(ownerLink("user", a.user), "clip", { title: a.user || "" }) : "",
      td(`${a.step === null || a.step === undefined ? "" : `${a.step + 1}. `}${a.action.replaceAll("_", " ")}`),
      td(el("span", { class: `chip ${OUTCOME_CLASS[a.outcome] || ""}`, text: a.outcome })),
      td(a.dry_run ? "dry run" : ""), td([a.driver, a.mode].filter(Boolean).join(" ")),
      td(a.reason || "", "wrap"), td(a.detail || "", "mono wrap"), td(triggerText(a), "wrap")));
    const heads = ["when", "policy", ...(withJob ? ["job", "user"] : []), "step", "outcome", "dry run", "driver", "why", "detail", "triggered by"];
    return table(heads, trs, { id: withJob ? "actions" : "job-actions" });
  }

  // Messages queued for people (owner notices, periodic reports): meant for whom, sent to
  // whom (a fallback to the team or the admins says why), on which channel, and whether it went.
  const NOTICE_CLASS = { pending: "st-pending", sent: "st-resolved", failed: "st-firing", unreachable: "st-firing" };

  function noticesTable(notices, id) {
    const trs = notices.map((n) => el("tr", { "data-notice": n.id, "data-status": n.status, "data-kind": n.kind },
      td(when(n.created_at)), td(n.kind.replaceAll("_", " ")), td(n.subject, "wrap"), td(n.job_id ? jobLink(n.job_id) : "", "clip"),
      td(n.asked), td([n.recipient || "", n.fallback ? ` (fallback: ${n.fallback}${n.reason ? `, ${n.reason}` : ""})` : ""].join(""), "wrap"),
      td([n.channel, n.address].filter(Boolean).join(" "), "mono wrap"),
      td(el("span", { class: `chip ${NOTICE_CLASS[n.status] || ""}`, text: n.status }), "", { title: n.error || "" }), td(when(n.sent_at))));
    return table(["queued", "kind", "subject", "job", "meant for", "sent to", "channel", "status", "sent"], trs, { id });
  }

  // A user's or team's periodic report: whether they get it; an admin can opt them out or back in.
  function reportOptPanel(kind, name, optOuts, reload) {
    const mine = optOuts.find((o) => o.recipient === `${kind}:${name}`);
    const box = el("div", { class: "panel", id: "owner-report", "data-opted-out": mine ? "1" : "0" }, el("span", { id: "owner-report-state",
      text: mine ? `Opted out of the periodic report since ${when(mine.opted_out_at)}${mine.by ? ` (by ${mine.by})` : ""}.`
        : "Not opted out: gets the periodic report the site sends (GPUWARDEN_REPORT_PERIOD)." }));
    // A person signed in through single sign-on manages their own report and channel.
    const own = Boolean(session && session.user && kind === "user" && session.user === name);
    if (!(session && session.role === "admin") && !own) {
      box.append(" ", el("span", { class: "muted", text: "Admins can opt a user or team out." }));
      return box;
    }
    box.append(" ", el("button", { type: "button", id: "owner-opt", class: mine ? "small" : "small danger", text: mine ? "Opt back in" : "Opt out",
      onclick: async () => {
        try { await api(`/reports/opt-outs/${kind}/${encodeURIComponent(name)}`, { method: mine ? "DELETE" : "PUT" }); await reload(); }
        catch (err) { showError(err); }
      } }));
    if (own) box.append(channelChooser(reload));
    return box;
  }

  function channelChooser(reload) {
    // Mail goes to the address the identity provider vouches for; Slack to the member id given.
    const slackIn = el("input", { id: "channel-slack", size: 12, placeholder: "U0123ABCD" });
    const wrap = el("p", { id: "owner-channel" }, el("span", { id: "channel-state", text: "Your notices go to: …" }), " ",
      el("button", { type: "button", class: "small", id: "channel-mail", text: "Mail me",
        onclick: () => api("/session/channel", { method: "PUT", body: { channel: "mail" } }).then(reload).catch(showError) }), " ",
      slackIn, el("button", { type: "button", class: "small", id: "channel-dm", text: "Slack DM me",
        onclick: () => api("/session/channel", { method: "PUT", body: { channel: "slack", slack: slackIn.value.trim() } }).then(reload).catch(showError) }));
    api("/session/channel").then((c) => {
      wrap.querySelector("#channel-state").textContent = `Your notices go to: ${c.channel === "mail" ? `mail (${c.email})` : c.channel === "slack" ? `Slack DM (${c.slack})` : "nowhere yet"}`;
    }).catch(() => {});
    return wrap;
  }

  async function actionsPage() {
    const chosen = Object.fromEntries(ACTION_FILTERS.map((k) => [k, urlParam(k) || ""]));
    keepInUrl("/actions", chosen);
    page("Actions", "Every step of the policies' ladders, newest first: warnings sent, jobs reclaimed, and what a dry run would have done; skipped and failed steps say why.");
    const text = (name, placeholder) => el("label", {}, name, el("input", { id: `action-${name}`, value: chosen[name], size: 14, placeholder }));
    const outcomeSel = el("select", { id: "action-outcome" }, el("option", { value: "", text: "all" }),
      ACTION_OUTCOMES.map((o) => el("option", { value: o, text: o, selected: o === chosen.outcome })));
    const sinceSel = el("select", { id: "action-since" }, [["", "all time"], ["24h", "last 24 hours"], ["7d", "last 7 days"], ["30d", "last 30 days"]]
      .map(([v, t]) => el("option", { value: v, text: t, selected: v === chosen.since })));
    const form = el("form", { class: "filters", id: "action-filters" }, text("policy", "gpu-idle"), el("label", {}, "outcome", outcomeSel),
      text("user", "alice"), text("team", "vision"), text("job", "slurm:4242"), el("label", {}, "range", sinceSel), el("button", { type: "submit", text: "Show" }));
    const apply = () => {
      for (const k of ["policy", "user", "team", "job"]) chosen[k] = form.querySelector(`#action-${k}`).value.trim();
      chosen.outcome = outcomeSel.value;
      chosen.since = sinceSel.value;
      keepInUrl("/actions", chosen);
      actionsPage().catch(showError);
    };
    form.addEventListener("submit", (e) => { e.preventDefault(); apply(); });
    outcomeSel.addEventListener("change", apply);
    sinceSel.addEventListener("change", apply);
    app.append(form);
    const actions = await api(`/actions?${q({ ...chosen, limit: 500 })}`);
    const count = (o) => actions.filter((a) => a.outcome === o).length;
    app.append(el("div", { class: "cards", id: "action-cards" }, card("steps", actions.length),
      ACTION_OUTCOMES.map((o) => { const c = card(o, count(o), count(o) && (o === "reclaimed" || o === "failed") ? "bad" : ""); c.dataset.outcome = o; return c; }),
      el("div", { class: "card" }, el("div", { class: "k", text: "download" }),
        el("a", { class: "button", id: "actions-csv", href: `/api/v1/actions?${q({ ...chosen, limit: 1000, format: "csv" })}`, download: "gpuwarden-actions.csv", text: "CSV" }))));
    if (actions.length === 500) app.append(el("p", { class: "note", text: "The newest 500 steps; narrow the filters (or download the CSV) for older ones." }));
    app.append(actions.length ? actionsTable(actions) : el("p", { class: "muted", id: "no-actions", text: "No ladder steps match." }));
    // What was sent to people, with the same user, team, job and range (policy and outcome are the steps' own).
    const notices = await api(`/notices?${q({ user: chosen.user, team: chosen.team, job: chosen.job, start: chosen.since && `-${chosen.since}`, limit: 200 })}`);
    app.append(el("h2", { text: "Notices sent" }), notices.length ? noticesTable(notices, "notices")
      : el("p", { class: "muted", id: "no-notices", text: "No notice matches." }));
    // Who changed the policies, ladders, channels, silences, prices and owner entries.
    const changes = await api("/changes?limit=100");
    app.append(el("h2", { text: "Configuration changes" }), changes.length
      ? table(["when", "who", "what", "which", "change"], changes.map((c) => el("tr", { "data-change": c.id },
        td(when(c.at)), td(c.actor), td(c.kind), td(c.name, "clip"), td(c.action))), { id: "changes" })
      : el("p", { class: "muted", id: "no-changes", text: "No change was made through the API yet." }));
  }

  // --- start -----------------------------------------------------------------------------

  function notFoundPage() {
    document.title = "Not found · GPU Warden";
    page("Page not found", "", el("p", { id: "not-found" }, "The console has no page at ", el("code", { text: location.pathname }),
      ". Its pages: ", el("a", { href: "/", text: "Fleet" }), ", ", el("a", { href: "/jobs", text: "Jobs" }), ", ",
      el("a", { href: "/costs", text: "Costs" }), ", ", el("a", { href: "/alerts", text: "Alerts" }), ", ", el("a", { href: "/actions", text: "Actions" }), "."));
  }

  async function start() {
    const path = location.pathname;
    const name = path === "/" ? "fleet" : path.split("/")[1];
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
    if (path === "/login") { loginPage(); return; }
    if (!CONSOLE_PATHS.includes(path) && !OWN_PAGE.test(path)) { notFoundPage(); return; }
    session = await api("/session");
    [causes, states] = await Promise.all(["causes", "states"].map((n) => fetch(`/console/${n}.json`).then((r) => r.json())));
    document.getElementById("who").textContent = session.user
      ? `${session.user}${session.teams.length ? ` (${session.teams.join(", ")})` : ""} · ${session.fleet ? session.role : "own and team jobs"}`
      : `${session.token_name || session.token_prefix + "…"} · ${session.role}`;
    // A person who sees only their own and their teams' jobs starts at their jobs, not the fleet.
    if (path === "/" && session.fleet === false) { location.replace("/jobs"); return; }
    const logout = document.getElementById("logout");
    logout.hidden = false;
    logout.addEventListener("click", async () => { await api("/session", { method: "DELETE" }); location.assign("/login"); });
    if (path === "/") await fleetPage();
    else if (path === "/jobs") await jobsPage();
    else if (path.startsWith("/jobs/")) await jobPage(decodeURIComponent(path.slice("/jobs/".length)));
    else if (path.startsWith("/users/")) await ownerPage("user", decodeURIComponent(path.slice("/users/".length)));
    else if (path.startsWith("/teams/")) await ownerPage("team", decodeURIComponent(path.slice("/teams/".length)));
    else if (path === "/costs") await costsPage();
    else if (path === "/alerts") await alertsPage();
    else if (path === "/actions") await actionsPage();
    document.body.dataset.ready = "1";
  }

  start().then(() => { document.body.dataset.ready = "1"; }).catch((err) => {
    if (err.status !== 401) showError(err);
    document.body.dataset.ready = "error";
  });
})();
