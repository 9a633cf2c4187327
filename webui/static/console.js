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

  // A new action clears the previous error.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var errors = document.getElementById("errors");
    var elt = event.detail && event.detail.elt;
    if (errors && elt && !(elt.hasAttribute && elt.hasAttribute("hx-trigger") && /every/.test(elt.getAttribute("hx-trigger")))) {
      errors.replaceChildren();
    }
  });

  // Keep the playground scrolled to the newest tokens.
  document.addEventListener("htmx:sseMessage", function () {
    var log = document.getElementById("chat-log");
    if (log) log.scrollTop = log.scrollHeight;
  });

  // Picking a date in a range filter makes the range a custom one (before htmx reads the form).
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (!(target instanceof Element) || !target.matches("input[data-custom-range]") || !target.form) return;
    var range = target.form.querySelector("select[name=range]");
    if (range) range.value = "custom";
  }, true);

  // Reset a form after htmx posted it successfully, when it asks for that.
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.matches || !event.detail.successful) return;
    if (elt.matches("form[data-reset]")) elt.reset();
    if (elt.matches("form[data-clear-prompt]")) {
      var prompt = elt.querySelector("textarea[name=prompt]");
      if (prompt) prompt.value = "";
    }
  });
})();
