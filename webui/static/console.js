/* LLM appliance console: the little behaviour htmx does not cover. No eval, no inline handlers (CSP). */
(function () {
  "use strict";

  function copyText(text, button) {
    var done = function () {
      var label = button.textContent;
      button.textContent = "Copied";
      window.setTimeout(function () { button.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(text) && done(); });
    } else if (fallbackCopy(text)) {
      done();
    }
  }

  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "hidden";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    var copy = target.closest("[data-copy]");
    if (copy) {
      var source = document.querySelector(copy.getAttribute("data-copy"));
      if (source) copyText(source.textContent.trim(), copy);
      return;
    }
    var dismiss = target.closest("[data-dismiss]");
    if (dismiss && dismiss.parentElement) dismiss.parentElement.remove();
  });

  // ---------------------------------------------------------------- feedback next to its control
  // An action's result appears next to the form or button that caused it, in a live region
  // (role=status) that screen readers announce, not at the top of the page:
  // - an error answer (4xx/5xx, the server's error partial) is swapped into that region;
  // - a success answer re-renders an area; the message it carries ([data-feedback]) is moved into
  //   the region beside the same control in the new area. A control that is gone (a revoked key's
  //   Revoke button) is looked for through its nearest surviving keyed ancestor (a row with
  //   data-key, data-model, data-user, data-team or data-job, an element with an id, a labelled
  //   section), and the message goes there.
  // After any swap, focus that fell to <body> goes back to the same control, or to the message,
  // or to the updated area: it never stays on <body>.
  var KEYED = ["data-key", "data-model", "data-user", "data-team", "data-job"];
  var VERBS = ["hx-post", "hx-get"];

  function attrSelector(name, value) { return "[" + name + '="' + CSS.escape(value) + '"]'; }

  function keyedSelector(el) {
    for (var i = 0; i < KEYED.length; i++) {
      if (el.hasAttribute(KEYED[i])) return attrSelector(KEYED[i], el.getAttribute(KEYED[i]));
    }
    if (el.id) return "#" + CSS.escape(el.id);
    if (el.tagName === "SECTION" && el.hasAttribute("aria-label")) return "section" + attrSelector("aria-label", el.getAttribute("aria-label"));
    return null;
  }

  function controlSelector(el) {
    for (var i = 0; i < VERBS.length; i++) {
      if (el.hasAttribute(VERBS[i])) return attrSelector(VERBS[i], el.getAttribute(VERBS[i]));
    }
    return null;
  }

  // How to find `el` (a control, or the element that had focus inside it) again after its area is re-rendered.
  function locator(el) {
    var anchors = [];
    for (var up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      var sel = keyedSelector(up);
      if (sel) anchors.push(sel);
    }
    var control = el.closest ? el.closest(VERBS.map(function (v) { return "[" + v + "]"; }).join(",")) : null;
    var inner = null;
    if (control && control !== el) {
      if (el.getAttribute("data-testid")) inner = attrSelector("data-testid", el.getAttribute("data-testid"));
      else if (el.name) inner = el.tagName.toLowerCase() + attrSelector("name", el.name);
      else inner = el.tagName.toLowerCase();
    }
    return {control: control ? controlSelector(control) : null, inner: inner, anchors: anchors};
  }

  function relocate(loc) {
    for (var i = 0; i < loc.anchors.length; i++) {
      var anchor = document.querySelector(loc.anchors[i]);
      if (!anchor) continue;
      var control = loc.control ? anchor.querySelector(loc.control) : null;
      return {anchor: anchor, control: control};
    }
    return null;
  }

  function newSlot() {
    var slot = document.createElement("div");
    slot.className = "feedback";
    slot.setAttribute("role", "status");
    slot.setAttribute("aria-live", "polite");
    return slot;
  }

  function slotAfter(control) {
    var next = control.nextElementSibling;
    if (next && next.classList.contains("feedback")) return next;
    var slot = newSlot();
    control.after(slot);
    return slot;
  }

  function slotIn(anchor) {
    var host = anchor.tagName === "TR" ? anchor.lastElementChild || anchor : anchor;
    var found = host.querySelector(":scope > .feedback");
    if (found) return found;
    var slot = newSlot();
    var heading = host.querySelector(":scope > h2, :scope > .card-head");
    if (heading) heading.after(slot); else if (anchor.tagName === "TR") host.append(slot); else host.prepend(slot);
    return slot;
  }

  function isAction(elt) {
    if (!elt || !elt.matches || !elt.isConnected) return false;
    var trigger = elt.getAttribute("hx-trigger") || "";
    return !/\b(every|load)\b/.test(trigger) && !elt.hasAttribute("sse-swap");
  }

  function focusable(el) {
    if (!el) return null;
    if (el.matches("button, select, input:not([type=hidden]), textarea, a[href]")) return el;
    return el.querySelector("button:not([disabled]), select, input:not([type=hidden]), textarea");
  }

  function focusRegion(el) {
    if (!el || !el.isConnected) return false;
    if (!el.hasAttribute("tabindex") && !focusable(el)) el.setAttribute("tabindex", "-1");
    (el.hasAttribute("tabindex") ? el : focusable(el)).focus({preventScroll: false});
    return document.activeElement === el || el.contains(document.activeElement);
  }

  // Scroll just enough that the whole message is on screen.
  function reveal(slot) {
    var box = slot.getBoundingClientRect();
    if (box.top < 0 || box.bottom > window.innerHeight) slot.scrollIntoView({block: "nearest", inline: "nearest"});
  }

  function focusDropped() {
    var active = document.activeElement;
    return !active || active === document.body || !active.isConnected;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    var xhr = event.detail && event.detail.xhr;
    if (!isAction(elt) || !xhr) return;
    var errors = document.getElementById("errors");
    if (errors) errors.replaceChildren();
    var control = elt.closest("form") || elt;
    slotAfter(control).replaceChildren();
    xhr.consoleOrigin = {control: control, where: locator(control)};
    // remembered now: a button that hx-disabled-elt disables while the request runs (Load) drops the focus to <body>
    var active = document.activeElement;
    if (active && active !== document.body && control.contains(active)) xhr.consoleFocus = locator(active);
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    var detail = event.detail;
    var origin = detail.xhr && detail.xhr.consoleOrigin;
    var active = document.activeElement;
    if (detail.xhr && active && active !== document.body && !detail.xhr.consoleFocus) detail.xhr.consoleFocus = locator(active);
    if (!origin || detail.xhr.status < 400) return;
    // the control may have been re-rendered meanwhile (a live update of its row): its new copy takes the message
    var found = origin.control.isConnected ? {anchor: null, control: origin.control} : relocate(origin.where);
    if (!found) return;
    detail.shouldSwap = true;
    detail.isError = false;
    detail.target = found.control ? slotAfter(found.control) : slotIn(found.anchor);
    detail.swapOverride = "innerHTML";
    origin.placedError = detail.target;
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    var xhr = event.detail && event.detail.xhr;
    if (!xhr || xhr.consoleSettled) return;
    xhr.consoleSettled = true;
    var origin = xhr.consoleOrigin;
    var placed = null;
    if (origin && xhr.status >= 400 && origin.placedError && origin.placedError.isConnected) {
      // a refusal takes the focus, so it is read out and the fields the user typed stay as they were
      reveal(origin.placedError);
      var refusal = origin.placedError.querySelector("[role=alert]") || origin.placedError;
      refusal.setAttribute("tabindex", "-1");
      refusal.focus({preventScroll: true});
      return;
    }
    if (origin && xhr.status < 400) {
      var found = origin.control.isConnected ? {anchor: null, control: origin.control} : relocate(origin.where);
      document.querySelectorAll("[data-feedback]:not([data-placed])").forEach(function (message) {
        message.setAttribute("data-placed", "");
        if (!found) return;
        var slot = found.control ? slotAfter(found.control) : slotIn(found.anchor);
        var details = slot.closest("details");
        if (details) details.open = true;
        message.remove();
        window.setTimeout(function () { slot.replaceChildren(message); reveal(slot); }, 50);  // a change in a live region is announced
        placed = slot;
      });
    }
    if (!xhr.consoleFocus || !focusDropped()) return;  // only focus that this swap took away is put back
    var again = xhr.consoleFocus ? relocate(xhr.consoleFocus) : null;
    var target = again && again.control && xhr.consoleFocus.inner ? again.control.querySelector(xhr.consoleFocus.inner) : null;
    target = target || (again && focusable(again.control));
    if (target && focusRegion(target)) return;
    if (placed && focusRegion(placed)) return;
    var region = event.detail.target && event.detail.target.isConnected ? event.detail.target : (again && again.anchor);
    if (region) focusRegion(region);
  });

  // ---------------------------------------------------------------- confirmations htmx cannot phrase
  // A role change asks first, saying what the new role means; dismissing it puts the select back.
  document.addEventListener("htmx:confirm", function (event) {
    var form = event.detail && event.detail.elt;
    if (!form || !form.matches || !form.matches("form[data-confirm-role]")) return;
    event.preventDefault();
    var select = form.querySelector("select[name=role]");
    var who = form.getAttribute("data-confirm-role");
    var question = select.value === "admin"
      ? "Make " + who + " an admin? Admins manage keys, users, models and the cache."
      : "Change the role of " + who + " to " + select.value + "?";
    if (window.confirm(question)) event.detail.issueRequest(true);
    else form.reset();
  });

  // ---------------------------------------------------------------- wide tables on narrow screens
  // A table wider than its box scrolls inside it: the box says so, and can be scrolled with the keyboard.
  function markScrollable(root) {
    (root || document).querySelectorAll("[data-scroll-hint]").forEach(function (wrap) {
      var more = wrap.scrollWidth > wrap.clientWidth + 1;
      wrap.classList.toggle("scrollable", more);
      if (more) {
        wrap.setAttribute("tabindex", "0");
        wrap.setAttribute("role", "region");
        var section = wrap.closest("section[aria-label]");
        wrap.setAttribute("aria-label", (section ? section.getAttribute("aria-label") : "Table") + " (scrolls sideways)");
      } else {
        ["tabindex", "role", "aria-label"].forEach(function (name) { wrap.removeAttribute(name); });
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { markScrollable(document); });
  window.addEventListener("resize", function () { markScrollable(document); });
  document.addEventListener("htmx:afterSettle", function () { markScrollable(document); });

  // Keep the playground scrolled to the newest tokens; a progress update that replaced the focused
  // control (a job's Cancel button) puts focus back on it, or on the job when it is gone.
  var sseFocused = null;
  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var active = document.activeElement;
    sseFocused = event.target instanceof Element && active && active !== document.body && event.target.contains(active) ? event.target : null;
  });
  document.addEventListener("htmx:sseMessage", function (event) {
    var log = document.getElementById("chat-log");
    if (log) log.scrollTop = log.scrollHeight;
    if (sseFocused && sseFocused === event.target && focusDropped()) {
      focusRegion(focusable(sseFocused) || sseFocused.closest("[data-job]") || sseFocused);
    }
    sseFocused = null;
  });

  // Picking a date in a range filter makes the range a custom one (before htmx reads the form).
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (!(target instanceof Element) || !target.matches("input[data-custom-range]") || !target.form) return;
    var range = target.form.querySelector("select[name=range]");
    if (range) range.value = "custom";
  }, true);

  // Reset a form after htmx posted it successfully, when it asks for that. An error answer is swapped in
  // beside the form (see above), which htmx then counts as successful: the status says it was not.
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    var xhr = event.detail && event.detail.xhr;
    if (!elt || !elt.matches || !event.detail.successful || !xhr || xhr.status >= 400) return;
    if (elt.matches("form[data-reset]")) elt.reset();
    if (elt.matches("form[data-clear-prompt]")) {
      var prompt = elt.querySelector("textarea[name=prompt]");
      if (prompt) prompt.value = "";
    }
  });

  // Playground: Send waits while a prompt is being sent or an answer streams (a turn marked
  // data-streaming until its stream closes: done, failure, Stop, or the turn removed), so answers do
  // not pile up; it comes back when the stream ends, or at once when the send itself was refused.
  function playgroundForm(elt) { return elt && elt.matches && elt.matches("form.play") ? elt : null; }

  function playgroundBusy() {
    var form = document.querySelector("form.play");
    if (!form) return false;
    return form.hasAttribute("data-sending") || document.querySelector("#chat-log [data-streaming]") !== null;
  }

  function updateSend() {
    var send = document.querySelector("form.play [data-testid=send]");
    if (!send) return;
    var busy = playgroundBusy();
    send.disabled = busy;
    send.textContent = busy ? "Answering…" : "Send";
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = playgroundForm(event.detail && event.detail.elt);
    if (!form) return;
    if (playgroundBusy()) { event.preventDefault(); return; }
    form.setAttribute("data-sending", "");
    updateSend();
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = playgroundForm(event.detail && event.detail.elt);
    if (!form) return;
    form.removeAttribute("data-sending");
    updateSend();
  });
  ["htmx:sseClose", "htmx:sseError"].forEach(function (name) {
    document.addEventListener(name, function (event) {
      var turn = event.target instanceof Element ? event.target.closest("[data-streaming]") : null;
      if (turn) turn.removeAttribute("data-streaming");
      updateSend();
    });
  });
  document.addEventListener("htmx:afterSettle", updateSend);

  // Playground: Enter sends the prompt, Shift+Enter inserts a newline.
  document.addEventListener("keydown", function (event) {
    var area = event.target;
    if (!(area instanceof HTMLTextAreaElement) || !area.hasAttribute("data-enter-sends")) return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (area.form && area.value.trim() && !playgroundBusy()) area.form.requestSubmit();
  });

  // Playground: a base model defaults to text completion, a chat model to chat.
  document.addEventListener("change", function (event) {
    var select = event.target;
    if (!(select instanceof HTMLSelectElement) || !select.hasAttribute("data-picks-mode") || !select.form) return;
    var option = select.selectedOptions[0];
    var mode = option ? option.getAttribute("data-mode") : null;
    var radio = mode ? select.form.querySelector("input[name=mode][value=" + mode + "]") : null;
    if (radio) radio.checked = true;
    var note = select.form.querySelector("[data-testid=base-note]");
    if (note) note.hidden = mode !== "completion";
  });
})();
