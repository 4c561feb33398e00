"""The Set-of-Mark labeller, run in the page: numbers what a person can use, writes the text.

``LABEL_JS`` (``page.evaluate(LABEL_JS, opts)``, ``opts = {marks, fromViewport, maxChars,
maxLabels}``, missing keys false/0; ``fromViewport: 'scrolled'`` means true when the page
is scrolled) makes one pass over the rendered page (same-origin iframes and open shadow
roots included) that:

- in ``marks`` mode first clears every ``data-som-id`` an earlier pass wrote (the elements it
  numbered are kept in a window-level list, and the documents are searched too), so a number
  never outlives its pass (a text-only pass leaves them);
- in ``marks`` mode gives every element a person can use a number, stored in the
  ``data-som-id`` attribute that ``click(n)`` / ``type(n, text)`` act through. Interactive
  means a strong signal (``a[href]``, buttons, inputs, selects, textareas, ``summary``,
  interactive ARIA roles, contenteditable hosts, a ``<label>`` whose control is hidden under
  a custom look) or a weak one (an ``onclick``/``onmousedown`` handler, a click-ish listener
  recorded by ``LISTENER_INIT_JS``, a match of a delegated handler's selector (a listener on
  the document, window, ``<html>`` or ``<body>`` whose source names it in ``closest``/
  ``matches``/``classList.contains``, or a jQuery ``.on(type, selector, fn)`` there),
  ``tabindex >= 0``, the topmost element of a ``cursor: pointer`` subtree). A weak element that holds numbered descendants is not
  numbered itself (they are), nor is one larger than 40 % of the viewport (a page-wide
  listener); one whose text is too long for a name is numbered with an empty name and its
  text written after the number. Nothing inside a numbered element is numbered. Left out:
  hidden (display, visibility, opacity 0 on it or above it, ``hidden``, ``inert``, inside a
  collapsed box that clips), zero-size, off the page's left or top edge, disabled
  (``:disabled``, ``fieldset[disabled]``, ``aria-disabled``), and covered — in the viewport
  the centre of the visible part is hit-tested (``elementFromPoint`` on the element's own
  root, frame by frame: it must land on the element or inside it, as a click must); below
  the fold, or under a bar pinned in view (a sticky header over the paragraph the view
  starts in: a scroll brings it out), an element counts as covered only while a modal (a
  fixed layer over >= 90 % of the viewport that is on top there, a modal ``<dialog>``) is
  open and it is outside it;
- writes the page's text the way the browser lays it out: whitespace collapsed per
  ``white-space`` (``pre``/``pre-wrap`` kept exactly), a new line where a block starts or
  ends, table rows one per line with cells joined by `` | ``, each numbered element inline
  as ``[12] link "Next page"`` (role; accessible name, at most 80 characters; `` value="..."``
  for inputs, selects, checkboxes) in place of its own text, a ``<label>`` whose control is
  numbered not written twice, ``[canvas WxH: not labellable]`` for canvases (also listed in
  ``unlabellable``) and ``[iframe <origin>: not readable]`` for cross-origin frames.

Numbers restart at 1 on every call, in document order, so the same page gives the same
numbers. With ``marks: false`` it only writes the text (the playwright mode). ``maxChars``
(> 0) bounds the text: the walk, and the numbering, stop there and ``more`` says text was
left out. With ``fromViewport`` (the page was scrolled) the text starts where the view
starts: at the paragraph the top edge cuts through (of side-by-side columns, the widest),
or, inside a block that starts more than a viewport above or a preformatted one (a long
``<pre>``), at the first visible line of it; nothing before is written or numbered, except
the bars pinned in view that come before it (a sticky header, a fixed footer, an open modal:
wide and short, found by hit-testing the view's top and bottom edges), written first.
The result: ``{text, elements, unlabellable, more, title, url, scrollY, scrollHeight,
viewportHeight}`` (and ``error`` when the page broke the walk: the text is what was written
up to there); an element is ``{id, role, name, value, states, tag, x, y, w, h}`` with its
box in viewport pixels of the top document.

``LISTENER_INIT_JS`` is an init script (every frame, before the page's scripts) that notes
which elements, documents and windows get click-ish listeners; ``OVERLAY_JS`` /
``REMOVE_OVERLAY_JS`` draw and remove the marks of the elements in view (one SVG in the
top layer) for a screenshot. ``OVERLAY_JS`` called with no list draws the last pass's
elements, which spares sending them back to the page. ``WATCH_JS`` / ``UNWATCH_JS`` count
the document's changes, and compare its layout, between drawing the marks and reading the
page again.
"""

LISTENER_INIT_JS = r"""
(() => {
  const KEY = Symbol.for('som.clickListeners');
  try {
    if (Object.prototype.hasOwnProperty.call(window, KEY)) return;
    const map = new WeakMap();  // element -> Map(listener -> Set('type|capture'))
    Object.defineProperty(window, KEY, {value: map});
    const CLICKISH = new Set(['click', 'mousedown', 'mouseup', 'pointerdown', 'pointerup',
      'touchstart']);
    const P = EventTarget.prototype;
    const add = P.addEventListener, remove = P.removeEventListener;
    const apply = Reflect.apply;
    const key = (type, options) => type + '|' + (typeof options === 'boolean' ? options :
      !!(options && typeof options === 'object' && options.capture));
    const wrapped = {
      addEventListener(type, listener, options) {
        try {
          // elements, and the document and window (where delegated handlers listen)
          if (listener && this && (this.nodeType === 1 || this.nodeType === 9 ||
              this.window === this) && CLICKISH.has(type)) {
            let m = map.get(this);
            if (!m) { m = new Map(); map.set(this, m); }
            let s = m.get(listener);
            if (!s) { s = new Set(); m.set(listener, s); }
            s.add(key(type, options));
          }
        } catch (e) { /* never the page's problem */ }
        return apply(add, this, arguments);
      },
      removeEventListener(type, listener, options) {
        try {
          const m = listener && this ? map.get(this) : undefined;
          const s = m && m.get(listener);
          if (s) {
            s.delete(key(type, options));
            if (!s.size) m.delete(listener);
          }
        } catch (e) { /* never the page's problem */ }
        return apply(remove, this, arguments);
      },
    };
    for (const name of ['addEventListener', 'removeEventListener']) {
      const f = wrapped[name];
      const text = 'function ' + name + '() { [native code] }';
      Object.defineProperty(f, 'length', {value: 2});
      Object.defineProperty(f, 'toString', {value: {toString() { return text; }}.toString});
      const d = Object.getOwnPropertyDescriptor(P, name);
      Object.defineProperty(P, name, {...d, value: f});
    }
  } catch (e) { /* a page that froze EventTarget: no listener signal, nothing else lost */ }
})();
"""

LABEL_JS = r"""
(opts) => {
  opts = opts || {};
  const marks = !!opts.marks;
  // 'scrolled': from the view when the page is scrolled (one round trip, not two)
  const fromViewport = opts.fromViewport === 'scrolled' ? window.scrollY > 0 : !!opts.fromViewport;
  const maxChars = opts.maxChars > 0 ? opts.maxChars : Infinity;
  const maxLabels = opts.maxLabels > 0 ? opts.maxLabels : Infinity;
  const LKEY = Symbol.for('som.clickListeners');
  const SKEY = Symbol.for('som.labelled');
  const SKIP = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'HEAD', 'TITLE', 'META',
    'LINK', 'OPTION', 'OPTGROUP', 'DATALIST', 'PARAM', 'SOURCE', 'TRACK', 'MAP', 'AREA', 'DESC',
    'OBJECT', 'EMBED']);
  const ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem',
    'menuitemcheckbox', 'menuitemradio', 'option', 'switch', 'combobox', 'textbox', 'searchbox',
    'slider', 'spinbutton', 'treeitem']);
  const NO_CONTENT_NAME = new Set(['textbox', 'searchbox', 'combobox', 'slider', 'spinbutton']);
  const CHECKABLE = new Set(['checkbox', 'radio', 'switch', 'menuitemcheckbox', 'menuitemradio']);
  const WS = /[ \t\n\r\f\u00a0]+/g;
  const doc0 = document, win0 = window;
  const docEl0 = doc0.documentElement;

  const tagOf = (el) => { const t = el.tagName; return t.charCodeAt(0) > 90 ? t.toUpperCase() : t; };
  const collapse = (s) => (s || '').replace(/\s+/g, ' ').trim();
  const firstTok = (s) => s.trim().split(/\s+/)[0].toLowerCase();
  const flatParent = (n) => n.assignedSlot || n.parentNode || n.host || null;
  function flatContains(a, b) {
    for (let n = b, i = 0; n && i < 4096; n = flatParent(n), i++) if (n === a) return true;
    return false;
  }
  function isBlock(d) {
    return !(d.startsWith('inline') || d === 'contents' || d === 'table-cell' || d === 'none' ||
      d.startsWith('ruby') || d === 'math');
  }
  function wsMode(s) {  // 0 collapse, 1 preserve, 2 preserve line breaks only
    const c = s.whiteSpaceCollapse;
    if (c) return c === 'collapse' ? 0 : c === 'preserve-breaks' ? 2 : 1;
    const w = s.whiteSpace;
    return w === 'normal' || w === 'nowrap' ? 0 : w === 'pre-line' ? 2 : 1;
  }
  function flatKids(el, t) {
    if (el.shadowRoot) return el.shadowRoot.childNodes;
    if (t === 'SLOT') { const a = el.assignedNodes({flatten: true}); return a.length ? a : el.childNodes; }
    if (t === 'DETAILS' && !el.open) {
      for (const c of el.children) if (tagOf(c) === 'SUMMARY') return [c];
      return [];
    }
    return el.childNodes;
  }

  // ---------------------------------------------------------------- 1. earlier numbers go
  // (a text-only pass numbers nothing and leaves the last numbering as it is)
  const labelled = [];
  if (marks) {
    const prev = win0[SKEY];
    if (Array.isArray(prev)) for (const el of prev) { try { el.removeAttribute('data-som-id'); } catch (e) {} }
    (function clear(d, depth) {
      for (const el of d.querySelectorAll('[data-som-id]')) el.removeAttribute('data-som-id');
      if (depth > 4) return;
      for (const f of d.querySelectorAll('iframe, frame')) {
        let fd = null;
        try { fd = f.contentDocument; } catch (e) {}
        if (fd) clear(fd, depth + 1);
      }
    })(doc0, 0);
    try {
      Object.defineProperty(win0, SKEY, {value: labelled, configurable: true, writable: true});
    } catch (e) {}
  }

  const vw0 = Math.min(win0.innerWidth, docEl0.clientWidth || win0.innerWidth) || win0.innerWidth;
  const vh0 = win0.innerHeight;
  const top = {doc: doc0, win: win0, ox: 0, oy: 0, clip: {l: 0, t: 0, r: vw0, b: vh0},
    chain: [], lmap: win0[LKEY], frame: null};

  // ---------------------------------------------------------------- 2. is a modal open?
  // (asked only once an element out of view needs it)
  let cover = null;
  const modalRoots = [];
  function findCover() {
    cover = false;
    try {
      const m = doc0.querySelector('dialog:modal');
      if (m) { cover = true; modalRoots.push(m); }
    } catch (e) {}
    for (const m of doc0.querySelectorAll('[aria-modal="true"]')) modalRoots.push(m);
    // a fixed layer over >= 90 % of the viewport that is on top nearly everywhere (not a
    // decorative background that shows only where the page has nothing)
    const big = new Map(), hits = new Map();
    const POINTS = [[0.5, 0.5], [0.05, 0.05], [0.95, 0.05], [0.05, 0.95], [0.95, 0.95]];
    for (const [fx, fy] of POINTS) {
      const x = vw0 * fx, y = vh0 * fy;
      let h = doc0.elementFromPoint(x, y);
      while (h && h.shadowRoot) {
        const inner = h.shadowRoot.elementFromPoint(x, y);
        if (!inner || inner === h) break;
        h = inner;
      }
      for (let n = h; n && n.nodeType === 1; n = n.assignedSlot || n.parentElement ||
          (n.parentNode && n.parentNode.host)) {
        const t = tagOf(n);
        if (t === 'BODY' || t === 'HTML') break;
        let b = big.get(n);
        if (b === undefined) {
          const s = getComputedStyle(n);
          b = false;
          if (s.position === 'fixed' && s.pointerEvents !== 'none' && !s.zIndex.startsWith('-')) {
            const r = n.getBoundingClientRect();
            const w = Math.min(r.right, vw0) - Math.max(r.left, 0);
            const hh = Math.min(r.bottom, vh0) - Math.max(r.top, 0);
            b = w > 0 && hh > 0 && w * hh >= 0.9 * vw0 * vh0;
          }
          big.set(n, b);
        }
        if (b) hits.set(n, (hits.get(n) || 0) + 1);
      }
    }
    for (const [n, k] of hits) if (k >= POINTS.length - 1) { cover = true; modalRoots.push(n); }
  }
  const insideModal = (el) => modalRoots.some((m) => m === el || m.contains(el) || flatContains(m, el));

  // ---------------------------------------------------------------- 3. where the text starts
  let startNode = null, startOffset = 0;
  const startAnc = new Set();
  const probe = doc0.createRange();
  if (fromViewport && doc0.body) {
    const s0 = findStart();
    if (s0) {
      for (let n = flatParent(s0.node); n; n = flatParent(n)) startAnc.add(n);
      if (s0.node === doc0.body || startAnc.has(doc0.body)) { startNode = s0.node; startOffset = s0.offset; }
    }
  }
  let started = startNode === null;
  // bars pinned in the view (a sticky header, a fixed footer, an open modal) that come
  // before where the text starts: a person sees them wherever the page is, so they are
  // written (and numbered) first. Side bars (tall, narrow) are not: they would fill the
  // budget on every scroll.
  const pinned = [];
  if (!started) {
    const FOLLOWS = Node.DOCUMENT_POSITION_FOLLOWING;
    const before = (e) => !e.contains(startNode) && (e.compareDocumentPosition(startNode) & FOLLOWS);
    const add = (e) => { if (e && !pinned.includes(e) && before(e)) pinned.push(e); };
    for (const y of [1, vh0 - 2]) {
      for (const fx of [0.02, 0.25, 0.5, 0.75, 0.98]) {
        let root = null;
        for (let e = doc0.elementFromPoint(vw0 * fx, y); e && e !== doc0.body && e !== docEl0;
          e = e.parentElement) {
          const p = getComputedStyle(e).position;
          if (p === 'fixed' || p === 'sticky') root = e;
        }
        if (!root) continue;
        const r = root.getBoundingClientRect();
        if (r.width >= 0.5 * vw0 && r.height <= 0.35 * vh0) add(root);
      }
    }
    for (const m of modalRoots) if (m.ownerDocument === doc0) add(m);
    pinned.sort((a, b) => (a.compareDocumentPosition(b) & FOLLOWS ? -1 : 1));
  }

  function findStart() {
    const body = doc0.body;
    const br = body.getBoundingClientRect();
    if (!(br.top < 0) || Math.max(br.bottom, br.top + body.scrollHeight) <= 0) return null;
    let B = body, Br = br, Bd = 'block';
    for (;;) {
      const res = {straddle: null, sr: null, sd: '', below: null, inline: false};
      scan(B, res);
      if (res.straddle) { B = res.straddle; Br = res.sr; Bd = res.sd; continue; }
      const t = tagOf(B);
      if (t === 'IFRAME' || t === 'CANVAS' || t === 'IMG' || t === 'VIDEO') return {node: B, offset: 0};
      if (!res.inline) {
        if (res.below) return {node: res.below, offset: 0};
        return {node: B, offset: 0};
      }
      if (Bd === 'table-cell') {
        const row = B.parentElement;
        if (row) {
          const rr = row.getBoundingClientRect();
          if (rr.top > -vh0) return {node: row, offset: 0};
        }
      }
      // a block that starts less than a viewport above is read from its beginning, but a
      // preformatted one (a long log) from its first visible line: each scroll moves on
      if (Br.top > -vh0 && wsMode(getComputedStyle(B)) === 0) return {node: B, offset: 0};
      return firstVisibleLine(B) || {node: B, offset: 0};
    }
  }
  function bottomOf(k) {  // null: no box of its own to tell
    let r;
    if (k.nodeType === 3) {
      if (!/\S/.test(k.nodeValue)) return null;
      probe.selectNodeContents(k);
      r = probe.getBoundingClientRect();
    } else if (k.nodeType === 1) {
      r = k.getBoundingClientRect();
    } else return null;
    return r.width || r.height ? r.bottom : null;
  }
  function firstNotAbove(kids) {  // children lie in document order: a binary search
    let lo = 0, hi = kids.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      let b = null;
      for (let j = mid; j < hi && j < mid + 16 && b === null; j++) b = bottomOf(kids[j]);
      if (b !== null && b > 0) hi = mid; else lo = mid + 1;
    }
    return Math.max(0, lo - 2);
  }
  function scan(n, res) {
    const kids = flatKids(n, n.nodeType === 1 ? tagOf(n) : '');
    for (let i = kids.length > 64 ? firstNotAbove(kids) : 0; i < kids.length; i++) {
      const k = kids[i];
      if (k.nodeType === 3) {
        if (!/\S/.test(k.nodeValue)) continue;
        res.inline = true;
        const b = bottomOf(k);
        if (b !== null && b > 0) return true;  // its text reaches into the view: it is the one
        continue;
      }
      if (k.nodeType !== 1) continue;
      const t = tagOf(k);
      if (SKIP.has(t)) continue;
      const s = getComputedStyle(k);
      const d = s.display;
      if (d === 'none') continue;
      if (d === 'contents') { if (scan(k, res)) return true; continue; }
      if (s.position === 'fixed' || s.position === 'sticky') continue;
      if (!isBlock(d)) {
        res.inline = true;
        const b = bottomOf(k);
        if (b !== null && b > 0) return true;
        continue;
      }
      const r = k.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      // a box of fixed height (height: 100%) whose content runs on below it still holds it
      if (r.bottom <= 0 && (s.overflowY !== 'visible' || r.top + k.scrollHeight <= 0)) continue;
      if (r.top < 0) {  // side-by-side columns all straddle: the widest is the content
        if (!res.straddle || r.width > res.sr.width) { res.straddle = k; res.sr = r; res.sd = d; }
        continue;
      }
      res.below = k;
      return true;
    }
    return false;
  }
  function firstVisibleLine(B) {
    const texts = [];
    (function collect(n) {
      for (const k of flatKids(n, tagOf(n))) {
        if (k.nodeType === 3) texts.push(k);
        else if (k.nodeType === 1 && !SKIP.has(tagOf(k))) collect(k);
      }
    })(B);
    if (!texts.length) return null;
    const range = doc0.createRange();
    const fixed = new Map();
    const inFixed = (tn) => {  // a fixed header is in view wherever the page is: not a start
      for (let e = tn.parentElement; e && e !== B; e = e.parentElement) {
        let f = fixed.get(e);
        if (f === undefined) {
          const p = getComputedStyle(e).position;
          f = p === 'fixed' || p === 'sticky';
          fixed.set(e, f);
        }
        if (f) return true;
      }
      return false;
    };
    const rectOf = (i) => {
      range.selectNodeContents(texts[i]);
      const r = range.getBoundingClientRect();
      return (r.width || r.height) && !inFixed(texts[i]) ? r : null;
    };
    // the first text node (with a box) whose bottom is below the top edge; layout order is
    // document order inside a block, so a binary search over the nodes finds it
    const state = (i) => {
      for (let j = i; j < texts.length && j < i + 64; j++) {
        const r = rectOf(j);
        if (r) return r.bottom > 0;
      }
      return false;
    };
    let lo = 0, hi = texts.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (state(mid)) hi = mid; else lo = mid + 1; }
    let j = lo;
    for (; j < texts.length; j++) {
      const r = rectOf(j);
      if (r && r.bottom > 0) break;
    }
    if (j >= texts.length) return null;
    const tn = texts[j], data = tn.data;
    // the first character whose line is (partly) in view: the bottom of [lo, k] grows with k
    let a = 0, b = data.length - 1;
    while (a < b) {
      const mid = (a + b) >> 1;
      range.setStart(tn, a);
      range.setEnd(tn, mid + 1);
      const r = range.getBoundingClientRect();
      if (r.height > 0 && r.bottom > 0) b = mid; else a = mid + 1;
    }
    let k = a;
    const pe = tn.parentElement;
    const pre = pe && wsMode(getComputedStyle(pe)) !== 0;
    if (k > 0) {
      if (pre) k = data.lastIndexOf('\n', k - 1) + 1;
      else while (k > 0 && !/\s/.test(data[k - 1])) k--;
    }
    if (k === 0 && pe && pe !== B) {  // a line that starts with a link starts at the link
      const a0 = pe.closest('a[href], button, label, summary, [role], [onclick], [tabindex]');
      if (a0 && a0 !== B && B.contains(a0)) return {node: a0, offset: 0};
    }
    return {node: tn, offset: k};
  }

  // ---------------------------------------------------------------- 4. the writer
  const lines = [];
  let cur = '', curPre = false, count = 0;
  let full = false, done = false, more = false;
  let rowCells = 0;
  const elements = [], unlab = [];
  let next = 1;

  function put(s) {
    if (done) return;
    if (full) { if (/\S/.test(s)) { more = true; done = true; } return; }
    const room = maxChars - count;
    if (s.length > room) {
      let cut = s.slice(0, room);
      if (/\S/.test(s.slice(room))) {
        more = true;
        done = true;
        const sp = cut.lastIndexOf(' ');
        if (sp > 0 && sp > room - 40 && s[room] !== ' ') cut = cut.slice(0, sp);
      }
      cur += cut;
      count += cut.length;
      full = true;
      return;
    }
    cur += s;
    count += s.length;
    if (count >= maxChars) full = true;
  }
  function brk() {
    if (cur === '') { curPre = false; return; }
    if (!curPre) {
      const n = cur.length;
      cur = cur.trimEnd();
      count -= n - cur.length;
    }
    if (cur !== '') { lines.push(cur); count += 1; }
    cur = '';
    curPre = false;
  }
  function nl() {  // a preserved line break
    if (full) return;
    lines.push(curPre ? cur : cur.trimEnd());
    count += 1;
    if (count >= maxChars) full = true;
    cur = '';
    curPre = true;
  }
  function collapsed(raw) {
    let s = raw.replace(WS, ' ');
    if (s.charCodeAt(0) === 32 && (cur === '' || cur.charCodeAt(cur.length - 1) === 32)) s = s.slice(1);
    if (s) put(s);
  }
  function text(raw, ws) {
    if (ws === 0) { collapsed(raw); return; }
    const parts = raw.split('\n');
    for (let i = 0; i < parts.length && !done; i++) {
      if (ws === 1) {
        if (i) nl();
        if (parts[i]) { curPre = true; put(parts[i]); }
      } else {
        if (i) brk();
        collapsed(parts[i]);
      }
    }
  }
  function token(tok) {  // a whole token or nothing
    if (done) return false;
    const s = (cur !== '' && cur.charCodeAt(cur.length - 1) !== 32 ? ' ' : '') + tok + ' ';
    if (count + s.length > maxChars) { more = true; done = true; return false; }
    cur += s;
    count += s.length;
    if (count >= maxChars) full = true;
    return true;
  }
  const save = () => ({n: lines.length, cur, curPre, count, full, done, more, rowCells,
    u: unlab.length});
  function restore(p) {
    lines.length = p.n;
    cur = p.cur; curPre = p.curPre; count = p.count; full = p.full; done = p.done; more = p.more;
    rowCells = p.rowCells; unlab.length = p.u;
  }

  // ---------------------------------------------------------------- 5. names, roles, values
  function contentText(el, skipControls) {
    const kids = el.shadowRoot ? null : el.childNodes;
    if (kids && kids.length === 1 && kids[0].nodeType === 3) return kids[0].nodeValue;
    const parts = [];
    let len = 0;
    (function rec(n) {
      for (const k of flatKids(n, tagOf(n))) {
        if (len > 300) return;
        if (k.nodeType === 3) { parts.push(k.nodeValue); len += k.nodeValue.length; continue; }
        if (k.nodeType !== 1) continue;
        const t = tagOf(k);
        if (SKIP.has(t) || k.hidden || k.getAttribute('aria-hidden') === 'true') continue;
        if (t === 'IMG' || (t === 'INPUT' && k.type === 'image')) {
          const alt = k.getAttribute('alt');
          if (alt) { parts.push(' ' + alt + ' '); len += alt.length; }
          continue;
        }
        if (t === 'INPUT' || t === 'SELECT' || t === 'TEXTAREA') {
          if (!skipControls && t === 'INPUT' && k.value && k.type !== 'password') parts.push(' ' + k.value + ' ');
          continue;
        }
        if (t === 'SVG') {
          const lab = k.getAttribute('aria-label') || (k.querySelector('title') || {}).textContent;
          if (lab) { parts.push(' ' + lab + ' '); len += lab.length; }
          continue;
        }
        const s = (k.ownerDocument.defaultView || win0).getComputedStyle(k);
        if (s.display === 'none' || s.visibility !== 'visible' && !k.firstElementChild) continue;
        const b = isBlock(s.display);
        if (b) parts.push(' ');
        rec(k);
        if (b) parts.push(' ');
      }
    })(el);
    return parts.join('');
  }
  function byIds(el, ids) {
    const root = el.getRootNode();
    const out = [];
    for (const id of ids.split(/\s+/)) {
      if (!id) continue;
      const n = (root.getElementById && root.getElementById(id)) || el.ownerDocument.getElementById(id);
      if (n) out.push(n.getAttribute('aria-label') || n.textContent);
    }
    return collapse(out.join(' '));
  }
  function roleOf(el, t) {
    const ra = el.getAttribute('role');
    if (ra && ra.trim()) {
      const r0 = firstTok(ra);
      if (r0 !== 'none' && r0 !== 'presentation' && r0 !== 'generic') return r0;
    }
    switch (t) {
      case 'A': return 'link';
      case 'BUTTON': case 'SUMMARY': return 'button';
      case 'SELECT': return 'combobox';
      case 'TEXTAREA': return 'textbox';
      case 'INPUT': {
        const ty = (el.type || 'text').toLowerCase();
        if (ty === 'submit' || ty === 'button' || ty === 'reset' || ty === 'image') return 'button';
        if (ty === 'checkbox' || ty === 'radio') return ty;
        if (ty === 'search') return 'searchbox';
        return 'textbox';
      }
    }
    return el.isContentEditable ? 'textbox' : 'clickable';
  }
  function accName(el, t, role) {
    let v = el.getAttribute('aria-labelledby');
    if (v) { const n = byIds(el, v); if (n) return n; }
    v = el.getAttribute('aria-label');
    if (v && v.trim()) return collapse(v);
    if (t === 'INPUT') {
      const ty = (el.type || '').toLowerCase();
      if (ty === 'submit' || ty === 'reset' || ty === 'button') {
        return collapse(el.value || (ty === 'submit' ? 'Submit' : ty === 'reset' ? 'Reset' : ''));
      }
      if (ty === 'image') return collapse(el.getAttribute('alt') || el.value || 'Submit');
    }
    const control = t === 'INPUT' || t === 'SELECT' || t === 'TEXTAREA';
    if (control || NO_CONTENT_NAME.has(role)) {
      if (control && el.labels && el.labels.length) {
        const n = collapse(Array.from(el.labels, (l) => contentText(l, true)).join(' '));
        if (n) return n;
      }
      return collapse(el.getAttribute('title') || el.getAttribute('placeholder') ||
        el.getAttribute('aria-placeholder') || '');
    }
    return collapse(contentText(el, false)) || collapse(el.getAttribute('title') || '');
  }
  function valueOf(el, t, role) {
    if (t === 'SELECT') {
      const picked = Array.from(el.selectedOptions || [], (o) => collapse(o.text));
      return picked.join(', ');
    }
    if (t === 'INPUT') {
      const ty = (el.type || 'text').toLowerCase();
      if (ty === 'checkbox' || ty === 'radio') return el.checked ? 'checked' : 'unchecked';
      if (ty === 'submit' || ty === 'reset' || ty === 'button' || ty === 'image') return null;
      if (ty === 'password') return el.value ? '********' : '';
      return String(el.value || '').slice(0, 1000);
    }
    if (t === 'TEXTAREA') return String(el.value || '').slice(0, 1000);
    if (CHECKABLE.has(role)) {
      const a = el.getAttribute('aria-checked');
      if (a !== null) return a === 'true' ? 'checked' : a === 'mixed' ? 'mixed' : 'unchecked';
    }
    if (el.isContentEditable) return collapse(contentText(el, false)).slice(0, 1000);
    return null;
  }
  function statesOf(el, t) {
    const st = {};
    let a;
    if (t === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio')) {
      st.checked = el.indeterminate ? 'mixed' : el.checked;
    } else if ((a = el.getAttribute('aria-checked')) !== null) {
      st.checked = a === 'mixed' ? 'mixed' : a === 'true';
    }
    if ((a = el.getAttribute('aria-selected')) !== null) st.selected = a === 'true';
    if (t === 'SUMMARY' && el.parentElement && tagOf(el.parentElement) === 'DETAILS') {
      st.expanded = el.parentElement.open;
    }
    if ((a = el.getAttribute('aria-expanded')) !== null) st.expanded = a === 'true';
    if ((a = el.getAttribute('aria-pressed')) !== null) st.pressed = a === 'mixed' ? 'mixed' : a === 'true';
    if (el.required || el.getAttribute('aria-required') === 'true') st.required = true;
    if (((t === 'INPUT' || t === 'TEXTAREA') && el.readOnly) || el.getAttribute('aria-readonly') === 'true') {
      st.readonly = true;
    }
    return st;
  }
  function namedByLabel(c) {
    const t = tagOf(c);
    if (t !== 'INPUT' && t !== 'SELECT' && t !== 'TEXTAREA') return false;
    if (t === 'INPUT' && /^(submit|reset|button|image)$/.test(c.type)) return false;
    return !c.hasAttribute('aria-labelledby') && !(c.getAttribute('aria-label') || '').trim();
  }
  function disabledEl(el, t) {
    if (el.getAttribute('aria-disabled') === 'true') return true;
    switch (t) {
      case 'BUTTON': case 'INPUT': case 'SELECT': case 'TEXTAREA': case 'FIELDSET':
        try { return el.matches(':disabled'); } catch (e) { return !!el.disabled; }
    }
    return false;
  }

  // ---------------------------------------------------------------- 6. can a person reach it?
  const reach = new Map();
  function reachable(el, r, ctx, ghost) {
    let v = reach.get(el);
    if (v === undefined) { v = reachNow(el, r, ctx, ghost); reach.set(el, v); }
    return v;
  }
  function reachNow(el, r, ctx, ghost) {
    const w = ctx.win;
    // off the page's left or top edge, or past its right end: nobody can scroll there
    if (r.right + w.scrollX <= 0 || r.bottom + w.scrollY <= 0) return false;
    if (ctx.sw === undefined) ctx.sw = Math.max(ctx.doc.documentElement.scrollWidth, w.innerWidth);
    if (r.left + w.scrollX >= ctx.sw) return false;
    const c = ctx.clip;
    const L = Math.max(r.left + ctx.ox, c.l), T = Math.max(r.top + ctx.oy, c.t);
    const R = Math.min(r.right + ctx.ox, c.r), B = Math.min(r.bottom + ctx.oy, c.b);
    if (R - L < 1 || B - T < 1) {  // out of view: only a modal can cover it
      if (ghost) return false;
      if (cover === null) findCover();
      return !(cover && !insideModal(ctx.frame || el));
    }
    if (hitOK(el, ctx, (L + R) / 2, (T + B) / 2)) return true;
    // second looks: a link wrapped over two lines, a control half under a sticky header
    const rects = el.getClientRects();
    if (rects.length > 1) {
      for (let i = 0; i < rects.length && i < 4; i++) {
        const q = rects[i];
        const l = Math.max(q.left + ctx.ox, c.l), t = Math.max(q.top + ctx.oy, c.t);
        const rr = Math.min(q.right + ctx.ox, c.r), b = Math.min(q.bottom + ctx.oy, c.b);
        if (rr - l >= 1 && b - t >= 1 && hitOK(el, ctx, (l + rr) / 2, (t + b) / 2)) return true;
      }
    } else if (B - T >= 8) {
      if (hitOK(el, ctx, (L + R) / 2, T + (B - T) * 0.8) || hitOK(el, ctx, (L + R) / 2, T + (B - T) * 0.2)) return true;
    }
    // under a bar pinned in view (a sticky header, a fixed footer): a scroll brings it out,
    // as it brings out what lies below the fold, so it is as usable (a modal aside)
    if (ghost || !underPinned(el, ctx, (L + R) / 2, (T + B) / 2)) return false;
    if (cover === null) findCover();
    return !(cover && !insideModal(ctx.frame || el));
  }
  function underPinned(el, ctx, X, Y) {
    const root = el.getRootNode();
    const from = root.elementFromPoint ? root : ctx.doc;
    for (let n = from.elementFromPoint(X - ctx.ox, Y - ctx.oy); n; n = flatParent(n)) {
      if (n.nodeType === 11) continue;  // a shadow root: on to its host
      if (n.nodeType !== 1) break;
      if (n.contains(el)) return false;  // what holds it scrolls with it, or is pinned with it
      const p = ctx.win.getComputedStyle(n).position;
      if (p === 'fixed' || p === 'sticky') return true;
    }
    return false;
  }
  function hitOK(el, ctx, X, Y) {
    const root = el.getRootNode();
    const from = root.elementFromPoint ? root : ctx.doc;
    const hit = from.elementFromPoint(X - ctx.ox, Y - ctx.oy);
    if (!hit) return false;
    // the element or something inside it: what a click there lands on (a label laid over
    // its control takes the click itself, and is numbered in the control's place)
    if (!(hit === el || el.contains(hit) || flatContains(el, hit))) return false;
    for (let i = ctx.chain.length - 1; i >= 0; i--) {  // and each frame on the way is on top
      const f = ctx.chain[i];
      const fr = f.el.getRootNode();
      if ((fr.elementFromPoint ? fr : f.doc).elementFromPoint(X - f.ox, Y - f.oy) !== f.el) return false;
    }
    return true;
  }
  const usableMemo = new Map();
  function usable(c, ctx) {  // would this label's control get a number?
    let v = usableMemo.get(c);
    if (v !== undefined) return v;
    v = false;
    const tc = tagOf(c);
    if (!disabledEl(c, tc) && !(tc === 'INPUT' && c.type === 'hidden') && !c.closest('[inert]') &&
        c.checkVisibility({visibilityProperty: true})) {
      const ghost = ctx.win.getComputedStyle(c).opacity === '0';
      const p = flatParent(c);
      const seen = ghost ? !p || p.nodeType !== 1 || p.checkVisibility({opacityProperty: true})
        : c.checkVisibility({opacityProperty: true});
      if (seen) {
        const r = c.getBoundingClientRect();
        if (r.width > 0 && r.height > 0) v = reachable(c, r, ctx, ghost);
      }
    }
    usableMemo.set(c, v);
    return v;
  }

  // ---------------------------------------------------------------- 6b. delegated handlers
  // One listener on the document (or the window, <html>, <body>) that acts for whatever a
  // selector matches. The selectors come from the listeners' own source (e.target.closest(
  // '.tab'), matches('li.item'), classList.contains('row')) and from jQuery's records of its
  // delegated handlers ($(document).on('click', '.tab', f)); an element one of them matches
  // is a weak signal, as its own listener would be. Selectors naming every element of a kind
  // that holds content ('div', 'p', ...) are left out: that is a click-anywhere handler.
  const BROAD = new Set(['*', 'html', 'body', 'div', 'span', 'p', 'section', 'main', 'article',
    'header', 'footer', 'nav', 'aside']);
  const SEL_RE = /\.(?:closest|matches|webkitMatchesSelector)\(\s*(['"`])((?:\\.|(?!\1)[^\\])*?)\1\s*[,)]/g;
  const CLS_RE = /classList\.contains\(\s*(['"`])([-\w]+)\1\s*\)/g;
  const JQ_TYPES = ['click', 'mousedown', 'mouseup', 'pointerdown', 'pointerup', 'touchstart'];
  function selectorsOf(fn, out) {
    if (typeof fn !== 'function') return;
    let src = '';
    try { src = Function.prototype.toString.call(fn); } catch (e) { return; }
    if (src.length > 100000) src = src.slice(0, 100000);
    for (const m of src.matchAll(SEL_RE)) {
      if (m[1] === '`' && m[2].includes('${')) continue;
      out.add(m[2].replace(/\\(['"`\\])/g, '$1'));
    }
    for (const m of src.matchAll(CLS_RE)) out.add('.' + CSS.escape(m[2]));
  }
  function delegated(ctx) {
    if (ctx.dsel !== undefined) return ctx.dsel;
    ctx.dsel = null;
    const doc = ctx.doc, win = ctx.win, out = new Set();
    const targets = [doc, win, doc.documentElement, doc.body].filter(Boolean);
    if (ctx.lmap) {
      for (const tg of targets) {
        let m = null;
        try { m = ctx.lmap.get(tg); } catch (e) {}
        if (m) for (const fn of m.keys()) selectorsOf(typeof fn === 'function' ? fn : fn && fn.handleEvent, out);
      }
    }
    let jq = null;
    try { jq = win.jQuery || null; } catch (e) {}
    if (jq && typeof jq._data === 'function') {
      for (const tg of targets) {
        let ev = null;
        try { ev = jq._data(tg, 'events'); } catch (e) {}
        if (!ev) continue;
        for (const type of JQ_TYPES) {
          for (const h of ev[type] || []) {
            if (h && typeof h.selector === 'string' && h.selector) out.add(h.selector);
          }
        }
      }
    }
    const ok = [];
    for (const sel of out) {
      const q = sel.trim();
      if (!q || BROAD.has(q.toLowerCase())) continue;
      try { doc.documentElement.matches(q); } catch (e) { continue; }  // not CSS (a jQuery extension)
      ok.push(q);
      if (ok.length >= 50) break;
    }
    if (ok.length) ctx.dsel = ok.join(', ');
    return ctx.dsel;
  }

  // ---------------------------------------------------------------- 7. the walk
  function number(el, t, ctx, r, ctl, nameOverride) {
    const src = ctl || el;
    const ts = ctl ? tagOf(ctl) : t;
    const role = roleOf(src, ts);
    let name = nameOverride !== undefined ? nameOverride
      : ctl ? collapse(contentText(el, true)) || accName(ctl, ts, role) : accName(el, t, role);
    name = name.slice(0, 80);
    const value = valueOf(src, ts, role);
    let tok = '[' + next + '] ' + role + ' "' + name.replace(/"/g, "'") + '"';
    if (value !== null) tok += ' value="' + value.slice(0, 80).replace(/"/g, "'") + '"';
    if (!token(tok)) return;
    const id = next++;
    el.setAttribute('data-som-id', String(id));
    labelled.push(el);
    elements.push({id, role, name, value, states: statesOf(src, ts), tag: t.toLowerCase(),
      x: r.left + ctx.ox, y: r.top + ctx.oy, w: r.width, h: r.height});
  }

  function kids(el, t, s, ctx, ptr, fl, vis) {
    const list = flatKids(el, t);
    let ws = -1;
    let i = 0;
    if (!started) while (i < list.length && list[i] !== startNode && !startAnc.has(list[i])) i++;
    for (; i < list.length; i++) {
      if (done) return;
      const k = list[i];
      const nt = k.nodeType;
      if (nt === 1) { walk(k, ctx, ptr, fl); continue; }
      if (nt !== 3) continue;
      let v = k.nodeValue;
      if (!started) {
        if (k !== startNode) continue;
        started = true;
        v = v.slice(startOffset);
      }
      if (!vis || (fl & 2)) continue;
      if (ws < 0) ws = wsMode(s);
      text(v, ws);
    }
  }

  // fl: 1 inert, 2 the text is a numbered control's label (not written), 4 clipped away
  function walk(el, ctx, pPtr, fl) {
    if (done) return;
    const t = tagOf(el);
    if (SKIP.has(t)) return;
    if (!started) {
      if (el === startNode) started = true;
      else if (!startAnc.has(el)) return;
    }
    if (el.hidden) return;
    const s = ctx.win.getComputedStyle(el);
    const d = s.display;
    if (d === 'none') return;
    let ghost = false;
    if (s.opacity === '0') {  // invisible; a native control laid over a custom look still works
      if (!(started && marks && (t === 'INPUT' || t === 'SELECT' || t === 'TEXTAREA' || t === 'BUTTON'))) return;
      ghost = true;
    }
    if (t === 'BR') { if (started) brk(); return; }
    const vis = s.visibility === 'visible';
    const ptr = s.cursor === 'pointer';
    if (el.inert) fl |= 1;
    if (started && (t === 'INPUT' && el.type === 'hidden')) return;
    if (marks && started && !(fl & 4) && s.overflow !== 'visible') {
      // a collapsed box that clips (a closed accordion, a screen-reader-only span): what is
      // inside is not to be seen, nor used
      const r = el.getBoundingClientRect();
      if (r.width < 2 || r.height < 2) fl |= 4;
    }
    const block = isBlock(d);

    if (started && (t === 'CANVAS' || t === 'IFRAME' || t === 'FRAME')) {
      if (!vis) return;
      const r = el.getBoundingClientRect();
      if (t === 'CANVAS') {
        if (r.width > 0 && r.height > 0) {
          brk();
          if (token('[canvas ' + Math.round(r.width) + 'x' + Math.round(r.height) + ': not labellable]')) {
            unlab.push({kind: 'canvas', x: r.left + ctx.ox, y: r.top + ctx.oy, w: r.width, h: r.height});
          }
          brk();
        }
        return;
      }
      if (r.width < 2 || r.height < 2) return;
      frame(el, s, r, ctx, fl);
      return;
    }

    // ---- is it something to number?
    let strong = false, weak = 0, ctl = null, noWeak = false;
    if (started && marks && next <= maxLabels && vis && !(fl & 5)) {
      switch (t) {
        case 'A': strong = el.hasAttribute('href') || el.hasAttribute('xlink:href'); break;
        case 'BUTTON': case 'SELECT': case 'TEXTAREA': case 'INPUT': case 'SUMMARY':
          strong = true; break;
        case 'LABEL': {
          const c = el.control;
          if (c) {
            noWeak = true;
            if (usable(c, ctx)) {
              if (namedByLabel(c)) fl |= 2;  // the control's name says it: not written twice
            } else if (!disabledEl(c, tagOf(c)) && (c.type === 'checkbox' || c.type === 'radio' ||
                c.checkVisibility({opacityProperty: true, visibilityProperty: true}))) {
              strong = true;  // a custom look over a hidden checkbox, a label over its input
              ctl = c;
            }
          }
          break;
        }
      }
      if (!strong) {
        const ra = el.getAttribute('role');
        if (ra && ROLES.has(firstTok(ra))) strong = true;
        else if (el.hasAttribute('contenteditable') && el.isContentEditable &&
            !(el.parentElement && el.parentElement.isContentEditable)) strong = true;
      }
      if (!strong && !noWeak && t !== 'BODY' && t !== 'HTML') {
        if (el.onclick || el.onmousedown || el.onpointerdown) weak |= 2;
        else if (ctx.lmap) { const m = ctx.lmap.get(el); if (m && m.size) weak |= 2; }
        if (!(weak & 2)) { const ds = delegated(ctx); if (ds && el.matches(ds)) weak |= 2; }
        const ti = el.getAttribute('tabindex');
        // focusable, unless it is a scrolling region made reachable by keyboard (a <pre>)
        if (ti !== null && parseInt(ti, 10) >= 0 && t !== 'PRE' && s.overflowY !== 'auto' &&
            s.overflowY !== 'scroll' && s.overflowX !== 'auto' && s.overflowX !== 'scroll') weak |= 4;
        if (ptr && !pPtr) weak |= 1;
      }
    }
    if (ghost && !strong) return;

    if (block) brk();
    const cell = d === 'table-cell', row = d === 'table-row';
    if (cell && started && rowCells++ > 0) collapsed(' | ');
    const savedCells = rowCells;
    if (row) rowCells = 0;

    if (strong) {
      if (!disabledEl(el, t)) {
        const r = el.getBoundingClientRect();
        if (r.width > 0 && r.height > 0 && reachable(el, r, ctx, ghost)) {
          number(el, t, ctx, r, ctl);
          if (block) brk();
          if (row) rowCells = savedCells;
          return;
        }
      }
      if (ghost || t === 'INPUT' || t === 'SELECT' || t === 'TEXTAREA') {
        if (block) brk();
        return;
      }
    } else if (t === 'SELECT' || t === 'TEXTAREA' || t === 'INPUT') {
      if (block) brk();
      return;
    }

    if (weak) {
      // numbered only when nothing inside it is: walk first, then decide
      const snap = save();
      const n0 = elements.length;
      kids(el, t, s, ctx, ptr, fl, vis);
      if (elements.length === n0 && !disabledEl(el, t)) {
        const r = el.getBoundingClientRect();
        const big = r.width * r.height > 0.4 * vw0 * vh0;
        if (r.width > 0 && r.height > 0 && !big) {
          const written = count - snap.count;
          if (written <= 80) {
            if (reachable(el, r, ctx, false)) { restore(snap); number(el, t, ctx, r, null); }
          } else if (weak !== 4 && reachable(el, r, ctx, false)) {
            // too long for a name: the number, then its text, as it is
            restore(snap);
            number(el, t, ctx, r, null, '');
            kids(el, t, s, ctx, ptr, fl, vis);
          }
        }
      }
    } else if (t === 'Q' && started && vis && !(fl & 2)) {
      // the quotation marks the browser draws around a <q> (generated content, which
      // innerText leaves out): the text as the page shows it
      const open = quoteMark(el, ctx, '::before');
      if (open) collapsed(open);
      kids(el, t, s, ctx, ptr, fl, vis);
      const close = quoteMark(el, ctx, '::after');
      if (close) collapsed(close);
    } else {
      kids(el, t, s, ctx, ptr, fl, vis);
    }
    if (block) brk();
    if (row) rowCells = savedCells;
  }

  const QUOTES = [['\u201c', '\u201d'], ['\u2018', '\u2019']];  // quotes: auto, in English
  const QSTR = /"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'/g;
  const unq = (lit) => lit.slice(1, -1).replace(/\\(.)/g, '$1');
  function quoteMark(el, ctx, pseudo) {
    let c = '', qs = '';
    try {
      c = ctx.win.getComputedStyle(el, pseudo).content;
      qs = ctx.win.getComputedStyle(el).quotes;
    } catch (e) { return ''; }
    if (c === 'open-quote' || c === 'close-quote') {
      if (qs === 'none') return '';
      let pairs = QUOTES;
      const lits = qs && qs !== 'auto' ? qs.match(QSTR) : null;
      if (lits && lits.length >= 2) {
        pairs = [];
        for (let i = 0; i + 1 < lits.length; i += 2) pairs.push([unq(lits[i]), unq(lits[i + 1])]);
      }
      let depth = 0;  // a <q> inside a <q> takes the next pair
      for (let p = el.parentElement; p; p = p.parentElement) if (tagOf(p) === 'Q') depth++;
      const pair = pairs[Math.min(depth, pairs.length - 1)];
      return c === 'open-quote' ? pair[0] : pair[1];
    }
    const m = /^"((?:\\.|[^"\\])*)"$/.exec(c);  // a string of the page's own
    return m ? m[1].replace(/\\(.)/g, '$1') : '';
  }

  function frame(el, s, r, ctx, fl) {
    let fd = null;
    try { fd = el.contentDocument; } catch (e) {}
    brk();
    if (fd && fd.documentElement && fd.defaultView) {
      const fw = fd.defaultView;
      const ox = ctx.ox + r.left + el.clientLeft + (parseFloat(s.paddingLeft) || 0);
      const oy = ctx.oy + r.top + el.clientTop + (parseFloat(s.paddingTop) || 0);
      const iw = el.clientWidth - (parseFloat(s.paddingLeft) || 0) - (parseFloat(s.paddingRight) || 0);
      const ih = el.clientHeight - (parseFloat(s.paddingTop) || 0) - (parseFloat(s.paddingBottom) || 0);
      const c = ctx.clip;
      const clip = {l: Math.max(c.l, ox), t: Math.max(c.t, oy), r: Math.min(c.r, ox + iw),
        b: Math.min(c.b, oy + ih)};
      let lmap = null;
      try { lmap = fw[LKEY] || null; } catch (e) {}
      const nctx = {doc: fd, win: fw, ox, oy, clip, lmap, frame: ctx.frame || el,
        chain: ctx.chain.concat([{el, doc: ctx.doc, ox: ctx.ox, oy: ctx.oy}])};
      walk(fd.body || fd.documentElement, nctx, false, fl & 1);
    } else {
      let origin = '';
      const src = el.getAttribute('src') || '';
      try { origin = new URL(src, ctx.doc.baseURI).origin; } catch (e) {}
      if (!origin || origin === 'null') origin = src ? src.slice(0, 80) : 'sandboxed';
      token('[iframe ' + origin + ': not readable]');
    }
    brk();
  }

  let error;
  try {
    for (const p of pinned) {
      started = true;
      walk(p, top, false, 0);
      brk();
      started = false;
    }
    walk(doc0.body || docEl0, top, false, 0);
  } catch (e) {  // a page that breaks the walk still gets what was written up to there
    error = String(e && e.stack || e).slice(0, 500);
    more = true;
  }
  brk();
  try {  // what OVERLAY_JS draws when it is given no list
    Object.defineProperty(win0, Symbol.for('som.boxes'), {value: elements, configurable: true, writable: true});
  } catch (e) {}
  const out = lines.join('\n').replace(/^\n+|\n+$/g, '');
  return {text: out, elements, unlabellable: unlab, more, title: doc0.title, url: location.href,
    scrollY: win0.scrollY, scrollHeight: docEl0.scrollHeight, viewportHeight: vh0,
    ...(error ? {error} : {})};
}
"""


# The marks as one SVG in a closed shadow root (the page's styles cannot reach it, and
# the labeller's walk does not enter it) in the top layer: painted with the page's frame,
# where a canvas of the viewport's size cost ~2.5 ms to make and ~8 ms more per frame to
# composite (2 cores, environment's frame clock). Digits have one width in the font.
OVERLAY_JS = r"""
(elements) => {
  if (!Array.isArray(elements)) elements = window[Symbol.for('som.boxes')] || [];
  const old = document.getElementById('__som_overlay');
  if (old) old.remove();
  const vw = window.innerWidth, vh = window.innerHeight;
  const shown = elements.filter((e) => e.x + e.w > 0 && e.y + e.h > 0 && e.x < vw && e.y < vh);
  const K = Symbol.for('som.digit');
  let digit = window[K];
  if (!digit) {
    try {
      const g = new OffscreenCanvas(1, 1).getContext('2d');
      g.font = 'bold 11px sans-serif';
      digit = g.measureText('0').width;
      Object.defineProperty(window, K, {value: digit, configurable: true, writable: true});
    } catch (e) { digit = digit || 6.2; }
  }
  const NS = 'http://www.w3.org/2000/svg';
  const el = (tag, attrs, parent) => {
    const n = document.createElementNS(NS, tag);
    for (const k in attrs) n.setAttribute(k, attrs[k]);
    parent.appendChild(n);
    return n;
  };
  const host = document.createElement('div');
  host.id = '__som_overlay';
  host.style.cssText = 'all:initial;position:fixed;inset:0 auto auto 0;margin:0;padding:0;border:0;' +
    'background:transparent;pointer-events:none;z-index:2147483647;display:block;overflow:hidden;' +
    'width:' + vw + 'px;height:' + vh + 'px';
  let root = host;  // a page that broke attachShadow gets the marks without one
  try { root = host.attachShadow({mode: 'closed'}); } catch (e) {}
  const svg = el('svg', {width: vw, height: vh, style: 'display:block'}, root);
  const boxes = el('g', {fill: 'none', stroke: '#e0115f', 'stroke-width': 2}, svg);
  for (const e of shown) el('rect', {x: e.x + 1, y: e.y + 1, width: Math.max(e.w - 2, 0), height: Math.max(e.h - 2, 0)}, boxes);
  const tags = el('g', {fill: '#e0115f'}, svg);
  const texts = el('g', {fill: '#fff', 'font-family': 'sans-serif', 'font-weight': 'bold', 'font-size': '11px', 'dominant-baseline': 'text-before-edge'}, svg);
  for (const e of shown) {
    const s = String(e.id);
    const w = digit * s.length + 6;
    const x = Math.min(Math.max(e.x - 1, 0), vw - w);
    const y = e.y >= 14 ? e.y - 14 : Math.max(e.y, 0);
    el('rect', {x, y, width: w, height: 14}, tags);
    el('text', {x: x + 3, y: y + 1.5}, texts).textContent = s;
  }
  document.documentElement.appendChild(host);
  try {  // the top layer: above a modal dialog too
    host.popover = 'manual';
    host.showPopover();
  } catch (e) { /* no popover API: the z-index has to do */ }
}
"""

REMOVE_OVERLAY_JS = (
    "() => { const l = document.getElementById('__som_overlay'); if (l) l.remove(); }"
)

# With frames drawn by the environment (rollout.env.frames): the marks come off in the
# task after the next frame's animation frames, when that frame is painted and on its way
# to the screen; UNMARKED_TEXT_* wait for that, then read the whole page's text (the
# labeller's pass, as LABEL_CALL_JS / LABEL_JSON_JS), while the browser encodes the image
_UNMARKED = "window[Symbol.for('som.unmarked')]"
UNMARK_AFTER_FRAME_JS = (
    "() => { try { Object.defineProperty(window, Symbol.for('som.unmarked'), {configurable: true,"
    " writable: true, value: new Promise((r) => requestAnimationFrame(() => setTimeout(() => {"
    " ("
    + REMOVE_OVERLAY_JS
    + ")(); r(true); }, 0)))}); return true; } catch (e) { return false; } }"
)
UNMARKED_TEXT_CALL_JS = (
    "async (o) => { await " + _UNMARKED + "; const f = window[Symbol.for('som.label')];"
    " return f ? f(o) : null; }"
)


# Watching the page between drawing the marks and reading it again (a scroll's early
# capture, rollout.env.browser). WATCH_JS starts counting the document's mutation records
# and returns the layout's fingerprint (FINGERPRINT: scroll offsets, viewport, scroll size,
# the box of every numbered element) with the count of numbered elements; UNWATCH_JS stops,
# removes the marks and returns {n: records, fp, count}. Either gives null where nothing
# is or can be watched (a frozen window; another document than the one watched).
_FINGERPRINT = r"""
const fingerprint = () => {
  const de = document.documentElement;
  const parts = [scrollX, scrollY, innerWidth, innerHeight, de.scrollWidth, de.scrollHeight];
  const els = document.querySelectorAll('[data-som-id]');
  for (const e of els) {
    const r = e.getBoundingClientRect();
    parts.push(e.getAttribute('data-som-id'), r.x, r.y, r.width, r.height);
  }
  return {fp: parts.join(','), count: els.length};
};
"""

WATCH_JS = (
    "() => {\n"
    + _FINGERPRINT.strip()
    + r"""
  const K = Symbol.for('som.watch');
  try {
    const old = window[K];
    if (old) old.o.disconnect();
    const w = {n: 0, o: null};
    w.o = new MutationObserver((rs) => { w.n += rs.length; });
    w.o.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
    Object.defineProperty(window, K, {value: w, configurable: true, writable: true});
  } catch (e) { return null; }
  return fingerprint();
}
"""
)

UNWATCH_JS = (
    "() => {\n"
    + _FINGERPRINT.strip()
    + r"""
  const K = Symbol.for('som.watch');
  const w = window[K];
  let out = null;
  if (w) {
    try { delete window[K]; } catch (e) {}
    const n = w.n + w.o.takeRecords().length;
    w.o.disconnect();
    out = {n, ...fingerprint()};
  }
  const l = document.getElementById('__som_overlay');
  if (l) l.remove();
  return out;
}
"""
)

# The labeller installed in every document before the page's scripts (an init script, with
# ``LISTENER_INIT_JS``): a call then sends a few bytes, not the labeller's source, and the
# result comes back as one JSON string (Playwright's value-by-value transfer of a result
# with hundreds of elements costs more than the labelling). ``JSON.stringify`` is the one
# the document had before its scripts ran.
LABELLER_INIT_JS = (
    "(() => { try {\n"
    "  const KEY = Symbol.for('som.label');\n"
    "  if (Object.prototype.hasOwnProperty.call(window, KEY)) return;\n"
    "  const stringify = JSON.stringify;\n"
    "  const label = " + LABEL_JS.strip() + ";\n"
    "  Object.defineProperty(window, KEY, {value: (o) => stringify(label(o))});\n"
    "} catch (e) { /* a frozen window: LABEL_JSON_JS does the work */ } })();\n"
)
# the installed labeller's JSON, or null in a document that has none
LABEL_CALL_JS = "(o) => { const f = window[Symbol.for('som.label')]; return f ? f(o) : null; }"
# the same sent whole, for such a document
LABEL_JSON_JS = "(o) => JSON.stringify((" + LABEL_JS.strip() + ")(o))"
UNMARKED_TEXT_JSON_JS = (
    "async (o) => { await "
    + _UNMARKED
    + "; return JSON.stringify(("
    + LABEL_JS.strip()
    + ")(o)); }"
)
# either, then the marks of the elements in view drawn for a screenshot, in one call
LABEL_CALL_OVERLAY_JS = (
    "(o) => { const f = window[Symbol.for('som.label')]; if (!f) return null; const r = f(o); ("
    + OVERLAY_JS.strip()
    + ")(); return r; }"
)
LABEL_JSON_OVERLAY_JS = (
    "(o) => { const r = JSON.stringify(("
    + LABEL_JS.strip()
    + ")(o)); ("
    + OVERLAY_JS.strip()
    + ")(); return r; }"
)
