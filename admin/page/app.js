// The page of the ratewindow admin handler. It reads the handler's JSON
// routes, relative to the page, and writes what it shows with textContent
// only: keys are chosen by clients and must never become markup.
"use strict";

const $ = (id) => document.getElementById(id);

async function get(path, params) {
  const url = path + "?" + new URLSearchParams(params);
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await res.json();
  if (!res.ok) {
    throw new Error(body.error || res.status + " " + res.statusText);
  }
  return body;
}

function showError(err) {
  $("error").textContent = err ? err.message : "";
  $("error").hidden = !err;
}

function cell(text, numeric) {
  const td = document.createElement("td");
  td.textContent = String(text);
  if (numeric) td.className = "n";
  return td;
}

function limitText(l) {
  let s = l.count + " per " + l.window;
  if (l.algorithm !== "sliding-log") s += " (" + l.algorithm + ")";
  if (l.name) s = l.name + ": " + s;
  return s;
}

let rules = [];

async function loadRules() {
  rules = await get("api/rules", {});
  const select = $("rule");
  select.replaceChildren();
  for (const r of rules) {
    const opt = document.createElement("option");
    opt.value = r.name;
    opt.textContent = r.name + " (" + r.limits.map(limitText).join(", ") + ")";
    select.append(opt);
  }
  if (rules.length === 0) {
    showError(new Error("No rule is published: the application publishes its rules with Limiter.Publish."));
  }
}

async function lookup(rule, key) {
  $("usage").hidden = true;
  const u = await get("api/usage", { rule, key });
  $("usage-rule").textContent = u.rule;
  $("usage-key").textContent = u.key;
  $("blocked").textContent = u.blocked === "0s" ? "Not blocked." : "Blocked for another " + u.blocked + ".";
  $("override").textContent = u.override
    ? "Override: " + u.override.limits.map(limitText).join(", ") +
      (u.override.ttl === "0s" ? ", until removed." : ", for another " + u.override.ttl + ".")
    : "No override.";
  $("usage-rows").replaceChildren(...u.limits.map((lu) => {
    const tr = document.createElement("tr");
    tr.append(cell(limitText(lu.limit)), cell(lu.used, true), cell(lu.remaining, true), cell(lu.reset_after, true));
    return tr;
  }));
  $("usage").hidden = false;
}

async function loadTop() {
  const rule = $("rule").value;
  $("top-rule").textContent = rule;
  $("top-rows").replaceChildren();
  const info = rules.find((r) => r.name === rule);
  if (!info) return;
  if (!info.track_denied) {
    $("top-note").textContent = "This rule does not record its denied keys (TrackDenied).";
    return;
  }
  const top = await get("api/top", { rule, n: 20, since: $("since").value });
  $("top-note").textContent = top.keys.length === 0 ? "No key was denied." : "";
  $("top-rows").replaceChildren(...top.keys.map((k) => {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "key";
    b.textContent = k.key;
    b.addEventListener("click", () => {
      $("key").value = k.key;
      run(() => lookup(rule, k.key));
    });
    td.append(b);
    tr.append(td, cell(k.denials, true));
    return tr;
  }));
}

async function run(f) {
  try {
    showError(null);
    await f();
  } catch (err) {
    showError(err);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("lookup").addEventListener("submit", (e) => {
    e.preventDefault();
    run(() => lookup($("rule").value, $("key").value));
  });
  $("top-form").addEventListener("submit", (e) => {
    e.preventDefault();
    run(loadTop);
  });
  $("rule").addEventListener("change", () => run(loadTop));
  run(async () => {
    await loadRules();
    await loadTop();
  });
});
