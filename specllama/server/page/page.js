// specllama serve's live page: a chat over POST /v1/rounds (docs/apis.md, "Round
// events"), each round drawn as the seed article draws it. Plain script, no build step,
// nothing fetched from anywhere but this server.
(function () {
  "use strict";
  var KEY = "specllama-api-key";  // sessionStorage only: gone with the tab
  var $ = function (id) { return document.getElementById(id); };
  // What tests and curious users read: turns finished, SSE reads, events by name.
  var state = window.specllamaPage = {
    model: null, messages: [], busy: false, controller: null, turns: 0, reads: 0,
    events: {}, error: null
  };

  function headers() {
    var h = { "Content-Type": "application/json" };
    var key = sessionStorage.getItem(KEY);
    if (key) { h.Authorization = "Bearer " + key; }
    return h;
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function say(text) { $("status").textContent = text || ""; }

  async function errorOf(response) {
    try {
      var body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch (e) { return response.status + " " + response.statusText; }
  }

  // ------------------------------------------------------------------ key and model
  function askKey(why) {
    $("key-form").hidden = false;
    $("key-error").hidden = !why;
    $("key-error").textContent = why || "";
    $("send").disabled = true;
    $("key").focus();
    document.documentElement.dataset.needsKey = "1";
  }

  async function load() {
    var response = await fetch("/v1/models", { headers: headers() });
    if (response.status === 401) {
      askKey(sessionStorage.getItem(KEY) ? "that key was refused" : "");
      return;
    }
    if (!response.ok) { say(await errorOf(response)); return; }
    var card = (await response.json()).data[0];
    var s = card.speculative || {};
    state.model = card.id;
    $("pair").textContent = card.id;
    $("meta").textContent = [s.target, s.draft].filter(Boolean).join(" + ") +
      " · draft length " + s.draft_max + " · drafters " + (s.drafters || []).join(",");
    $("draft-max").options[0].textContent = "server's (" + s.draft_max + ")";
    $("drafters").options[0].textContent = "server's (" + (s.drafters || []).join(",") + ")";
    $("key-form").hidden = true;
    $("send").disabled = false;
    document.documentElement.dataset.ready = "1";
    // A link may offer a question (?ask=...), never send it: any site can open such a
    // link, and the page must not spend the machine or plant a turn on a link alone.
    var ask = new URLSearchParams(location.search).get("ask");
    if (ask && !$("prompt").value) { $("prompt").value = ask; }
  }

  // ------------------------------------------------------------------ one turn's chips
  function Turn(log) {
    this.el = el("div", "turn assistant");
    this.area = el("div", "tokens-area");
    this.pending = el("span", "pending");
    this.area.appendChild(this.pending);
    this.foot = el("div", "turn-foot");
    this.el.appendChild(this.area);
    this.el.appendChild(this.foot);
    log.appendChild(this.el);
  }

  function chip(kind, text, round, title) {
    var c = el("span", "token " + kind + (text ? "" : " empty"),
               text ? text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192") : "\u2205");
    c.dataset.round = round;
    c.title = "round " + round + " \u00b7 " + title;
    return c;
  }

  Turn.prototype.place = function (c, text) {
    this.area.insertBefore(c, this.pending);
    if (text && text.charAt(text.length - 1) === "\n") {
      this.area.insertBefore(el("span", "nl"), this.pending);
    }
  };

  Turn.prototype.drafts = function () {
    return Array.prototype.slice.call(this.pending.querySelectorAll(".token.draft"));
  };

  Turn.prototype.proposed = function (d) {
    var self = this, origins = d.origins || [];
    d.texts.forEach(function (t, i) {
      var predicted = origins[i] === "prediction";  // the request's own prediction
      self.pending.appendChild(chip(predicted ? "draft prediction" : "draft", t, d.round,
        "draft " + (i + 1) + " from " + (predicted ? "the prediction" : d.source) +
        ", being verified"));
    });
  };

  Turn.prototype.accepted = function (d) {
    var drafts = this.drafts(), self = this;
    d.texts.forEach(function (t, i) {
      var c = drafts[i] || chip("draft", t, d.round, "");
      c.className = "token accepted" + (t ? "" : " empty") +
        (c.classList.contains("prediction") ? " prediction" : "");
      c.title = "round " + d.round + " \u00b7 draft " + (i + 1) + " accepted";
      self.place(c, t);
    });
  };

  Turn.prototype.rejected = function (d) {
    var drafts = this.drafts(), self = this;
    drafts.slice(0, d.tokens.length).forEach(function (c) {
      c.className = "token rejected";
      c.title = c.title.replace("being verified", "rejected");
      self.place(c);
      setTimeout(function () { c.classList.add("gone"); }, 600);  // struck, briefly
      setTimeout(function () { c.remove(); }, 900);
    });
  };

  Turn.prototype.correction = function (d) {
    var what = { correction: "correction after a rejection", bonus: "bonus after a fully " +
                 "accepted draft", plain: "plain step (no draft)" }[d.kind] || d.kind;
    var c = chip("target", d.text, d.round, "from the big model: " + what);
    c.dataset.kind = d.kind;
    this.place(c, d.text);
  };

  Turn.prototype.figures = function (d) {
    this.pending.textContent = "";  // drafts a round left unused (an early end)
    $("stat-steps").textContent = d.target_steps;
    $("stat-tokens").textContent = d.tokens;
    $("stat-per-step").textContent = d.target_steps ?
      Number(d.tokens_per_step).toFixed(2) + "\u00d7" : "\u2014";
    $("stat-speed").textContent = d.tokens_per_s ? Number(d.tokens_per_s).toFixed(1) : "\u2014";
    if (d.final) { this.finish(d); }
  };

  Turn.prototype.finish = function (d) {
    var c = d.comparison;
    $("stat-versus").textContent = c && c.speedup ? c.speedup.toFixed(2) + "\u00d7" :
      (c && c.verdict === "off" ? "off" : "\u2014");
    $("comparison").textContent = c ? "Speculation " + c.line : "";
    $("note").hidden = !d.note;
    $("note").textContent = d.note || "";
    this.foot.appendChild(el("span", "", d.accepted + " of " + d.drafted +
      " drafts accepted · " + d.finish_reason));
    var button = el("button", "", "Download trace (JSON)");
    button.type = "button";
    var trace = d.trace, n = state.turns + 1;
    button.addEventListener("click", function () {
      var a = el("a");
      a.href = URL.createObjectURL(new Blob([JSON.stringify(trace, null, 1)],
                                            { type: "application/json" }));
      a.download = "specllama-trace-" + n + ".json";
      a.click();
      setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
    });
    this.foot.appendChild(button);
    this.el.dataset.accepted = d.accepted;
    this.el.dataset.tokens = d.tokens;
    this.el.dataset.done = "1";
    state.last = d;
  };

  // ------------------------------------------------------------------ the stream
  async function readEvents(response, handle) {
    var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "";
    for (;;) {
      var read = await reader.read();
      if (read.done) { return; }
      state.reads += 1;
      buffer = (buffer + decoder.decode(read.value, { stream: true })).replace(/\r\n?/g, "\n");
      var blocks = buffer.split("\n\n");
      buffer = blocks.pop();
      blocks.forEach(function (block) {
        var name = "message", data = [];
        block.split("\n").forEach(function (line) {
          if (line.indexOf("event:") === 0) { name = line.slice(6).trim(); }
          if (line.indexOf("data:") === 0) { data.push(line.slice(5).replace(/^ /, "")); }
        });
        if (data.length) { handle(name, JSON.parse(data.join("\n"))); }
      });
    }
  }

  function settings() {
    var body = {}, t = $("temperature").value, k = $("draft-max").value;
    if (t !== "") { body.temperature = Number(t); }
    if ($("max-tokens").value) { body.max_tokens = Number($("max-tokens").value); }
    if (k) { body.draft_max = k === "auto" ? "auto" : Number(k); }
    if ($("drafters").value) { body.drafters = $("drafters").value; }
    if ($("prediction").value) {
      body.prediction = { type: "content", content: $("prediction").value };
    }
    return body;
  }

  async function send(text) {
    if (state.busy || !state.model) { return; }
    state.busy = true;
    $("send").disabled = true;
    $("stop").hidden = false;
    var log = $("log");
    log.appendChild(el("div", "turn user", text));
    var messages = state.messages.concat([{ role: "user", content: text }]);
    var turn = new Turn(log), done = null;
    var body = Object.assign({ model: state.model, messages: messages, stream: true },
                             settings());
    state.controller = new AbortController();
    say("generating…");
    try {
      var response = await fetch("/v1/rounds", { method: "POST", headers: headers(),
        body: JSON.stringify(body), signal: state.controller.signal });
      if (response.status === 401) { turn.el.remove(); askKey("the key was refused"); return; }
      if (!response.ok) { throw new Error(await errorOf(response)); }
      await readEvents(response, function (name, d) {
        state.events[name] = (state.events[name] || 0) + 1;
        turn.el.dataset.first = turn.el.dataset.first || Date.now();  // when it streamed
        if (name === "error") { throw new Error(d.error ? d.error.message : "error"); }
        if (typeof turn[name] === "function") { turn[name](d); }
        if (name === "figures" && d.final) { done = d; }
      });
      if (!done) { throw new Error("the stream ended before the turn did"); }
      state.messages = messages.concat([{ role: "assistant", content: done.text }]);
      state.turns += 1;
      say("");
    } catch (e) {
      state.error = String(e.message || e);
      turn.foot.appendChild(el("span", "error", e.name === "AbortError" ? "stopped" :
                                                 state.error));
      say("");
    } finally {
      turn.el.dataset.end = Date.now();
      state.busy = false;
      state.controller = null;
      $("send").disabled = false;
      $("stop").hidden = true;
      document.documentElement.dataset.turns = state.turns;
    }
  }

  // ------------------------------------------------------------------ controls
  $("ask").addEventListener("submit", function (e) {
    e.preventDefault();
    var text = $("prompt").value.trim();
    if (text) { $("prompt").value = ""; send(text); }
  });
  $("prompt").addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); }
  });
  $("stop").addEventListener("click", function () {
    if (state.controller) { state.controller.abort(); }
  });
  $("clear").addEventListener("click", function () {
    if (state.busy) { return; }
    state.messages = [];
    $("log").textContent = "";
  });
  $("key-form").addEventListener("submit", function (e) {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("key").value);
    $("key").value = "";
    load();
  });
  $("send").disabled = true;
  state.send = send;
  load().catch(function (e) { say(String(e)); });
})();
