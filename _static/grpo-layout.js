/* grpo-companion: make wide content fit the reader's screen (issue 25, item 1).
 *
 * MathJax 3.2 cannot break a formula, so once it has typeset the page this script shrinks each
 * display equation wider than its box, and each inline formula wider than a line of its
 * paragraph, down to MIN_MATH_SCALE of its size. A display equation that would need more keeps
 * that size and gets a visible "scroll" hint (tests/book/test_overflow.py still counts it as
 * cut: such an equation is to be rewritten to break into lines). A table still wider than its
 * box once its cells wrap at spaces is stacked into one card per row on a phone; one that still
 * does not fit, or a wide table on a wider screen, gets the same hint. All of it is redone
 * when the window is resized or folded content opens. window.grpoBookLayout is a promise of
 * the latest pass.
 */
(function () {
  "use strict";

  var MIN_MATH_SCALE = 0.6;
  var HINT_CLASS = "grpo-scroll-hint";
  var STACKED_CLASS = "grpo-stacked";
  var PHONE_MAX_PX = 600;
  var SLACK_PX = 2;  // fit formulas this much inside their box, against rounding

  function hint(box, on) {
    var before = box.previousElementSibling;
    var has = before && before.classList.contains(HINT_CLASS);
    if (on && !has) {
      var note = document.createElement("div");
      note.className = HINT_CLASS;
      note.setAttribute("aria-hidden", "true");
      note.textContent = "wider than the page: scroll \u2192";
      box.parentNode.insertBefore(note, box);
    } else if (!on && has) {
      before.remove();
    }
  }

  function overflows(box) {
    return box.scrollWidth > box.clientWidth + 1;
  }

  // A math container's scrollWidth also counts its invisible assistive MathML, so the
  // typeset formula (mjx-math) is what is measured.
  function formulaWidth(container) {
    var formula = container.querySelector(":scope > mjx-math");
    return formula ? formula.getBoundingClientRect().width : container.scrollWidth;
  }

  function mathOverflows(container) {
    return formulaWidth(container) > room(container);
  }

  function mathHint(container, on) {
    var box = container.closest("div.math");
    if (box) {
      hint(box, on);
    }
  }

  // The width a formula may take: its own box for a display equation; for inline math, the
  // content width of the block it sits in (a formula wider than a line cannot wrap).
  function room(container) {
    if (container.getAttribute("display") === "true") {
      return container.clientWidth;
    }
    var block = container.parentElement;
    while (block && getComputedStyle(block).display.indexOf("inline") === 0) {
      block = block.parentElement;
    }
    if (!block) {
      return 0;
    }
    var style = getComputedStyle(block);
    return block.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  }

  function fitEquation(container) {
    if (container.dataset.grpoFont === undefined) {
      container.dataset.grpoFont = container.style.fontSize || "";
    }
    container.style.fontSize = container.dataset.grpoFont;
    var base = parseFloat(getComputedStyle(container).fontSize);
    var need = formulaWidth(container);
    var have = room(container) - SLACK_PX;
    if (have <= 0 || need <= have + 1) {
      mathHint(container, false);
      return;
    }
    var scale = Math.max(MIN_MATH_SCALE, Math.floor((have / need) * 100) / 100);
    container.style.fontSize = (base * scale).toFixed(2) + "px";
    // glyph widths do not scale exactly linearly; shrink a little more while it still overflows
    while (mathOverflows(container) && scale > MIN_MATH_SCALE) {
      scale = Math.max(MIN_MATH_SCALE, scale - 0.02);
      container.style.fontSize = (base * scale).toFixed(2) + "px";
    }
    mathHint(container, mathOverflows(container));
  }

  // Each body cell carries its column's header text, shown above it in a stacked table.
  function labelCells(table) {
    var heads = table.querySelectorAll("thead tr:last-child th");
    if (!heads.length) {
      return false;  // no column names to show: keep the table as it is
    }
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (cell, i) {
        if (heads[i]) {
          cell.setAttribute("data-column", heads[i].textContent.trim());
        }
      });
    });
    return true;
  }

  function tableBox(table) {
    return table.closest(".pst-scrollable-table-container") || table.parentElement;
  }

  function layout() {
    document.querySelectorAll("article.bd-article mjx-container").forEach(fitEquation);
    // A table that does not fit once its cells wrap at spaces is, on a phone, set as one card
    // per row, each cell under its column's name. One that still does not fit (or a wide
    // table on a wider screen, which breaking words would make unreadable) scrolls under a hint.
    var phone = document.documentElement.clientWidth < PHONE_MAX_PX;
    document.querySelectorAll("article.bd-article table").forEach(function (table) {
      var box = tableBox(table);
      table.classList.remove(STACKED_CLASS);
      if (phone && overflows(box) && labelCells(table)) {
        table.classList.add(STACKED_CLASS);
      }
      hint(box, overflows(box));
    });
  }

  function mathReady() {
    var wantsMath = document.querySelector('script[src*="mathjax"]');
    if (!wantsMath) {
      return Promise.resolve();
    }
    return new Promise(function (resolve) {
      var start = Date.now();
      (function poll() {
        var mj = window.MathJax;
        if (mj && mj.startup && mj.startup.promise) {
          mj.startup.promise.then(resolve, resolve);
        } else if (Date.now() - start > 10000) {
          resolve();
        } else {
          setTimeout(poll, 50);
        }
      })();
    });
  }

  var domReady = new Promise(function (resolve) {
    if (document.readyState === "loading") {
      document.addEventListener("DOMContentLoaded", resolve);
    } else {
      resolve();
    }
  });

  // myst-nb sets every glued value in bold, which marks a computed number; a glued sentence
  // (a verdict written by the notebook) is prose, and reads as prose.
  domReady.then(function () {
    document.querySelectorAll("span.pasted-text").forEach(function (span) {
      if (span.textContent.trim().split(/\s+/).length > 4) {
        span.classList.add("pasted-words");
      }
    });
  });

  window.grpoBookLayout = domReady.then(mathReady).then(function () {
    return document.fonts ? document.fonts.ready : null;
  }).then(layout);

  // Later passes: window.grpoBookLayout is replaced by a promise of the next pass.
  var pending = null;
  var waiting = [];
  function relayout(delay) {
    clearTimeout(pending);
    window.grpoBookLayout = new Promise(function (resolve) { waiting.push(resolve); });
    pending = setTimeout(function () {
      layout();
      waiting.splice(0).forEach(function (resolve) { resolve(); });
    }, delay);
  }

  window.addEventListener("resize", function () { relayout(150); });
  // folded content (hidden cells, solutions) is measured when it opens
  document.addEventListener("toggle", function () { relayout(0); }, true);
  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest(".toggle-button, .admonition-title")) {
      relayout(50);
    }
  }, true);
})();
