// The Set-of-Mark labeller (LABEL_JS) as of commit 7a1cf35, kept as the baseline for bench/env.py.

(opts) => {
  const INTERACTIVE = 'a[href], button, input, select, textarea, summary, [role=button], ' +
    '[role=link], [role=checkbox], [role=tab], [role=menuitem], [onclick], [contenteditable=""], ' +
    '[contenteditable=true]';
  const BLOCK = new Set(['ADDRESS','ARTICLE','ASIDE','BLOCKQUOTE','BR','DD','DIV','DL','DT',
    'FIELDSET','FIGCAPTION','FIGURE','FOOTER','FORM','H1','H2','H3','H4','H5','H6','HEADER','HR',
    'LI','MAIN','NAV','OL','P','PRE','SECTION','TABLE','TR','UL','CAPTION','DETAILS']);
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','SVG']);
  const out = [];
  const elements = [];
  let next = 1;

  function rendered(el, win) {
    const s = win.getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden') return false;
    if (el.type === 'hidden') return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  }
  function role(el) {
    const explicit = el.getAttribute('role');
    if (explicit) return explicit;
    const t = el.tagName;
    if (t === 'A') return 'link';
    if (t === 'BUTTON' || t === 'SUMMARY') return 'button';
    if (t === 'SELECT') return 'combobox';
    if (t === 'TEXTAREA') return 'textbox';
    if (t === 'INPUT') {
      const ty = (el.type || 'text').toLowerCase();
      if (['submit', 'button', 'reset', 'image'].includes(ty)) return 'button';
      if (ty === 'checkbox' || ty === 'radio') return ty;
      if (ty === 'search') return 'searchbox';
      return 'textbox';
    }
    return 'clickable';
  }
  function clean(s) { return (s || '').replace(/\s+/g, ' ').trim(); }
  function label(el, doc) {
    const aria = el.getAttribute('aria-label');
    if (aria) return clean(aria);
    if (el.id) {
      const l = doc.querySelector('label[for="' + CSS.escape(el.id) + '"]');
      if (l) return clean(l.innerText);
    }
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') {
      const wrap = el.closest('label');
      if (wrap) return clean(wrap.innerText);
      return clean(el.getAttribute('placeholder') || el.getAttribute('name') || el.value);
    }
    return clean(el.innerText || el.getAttribute('title') || el.getAttribute('alt') || '');
  }
  function value(el) {
    if (el.tagName === 'SELECT') {
      const o = el.options[el.selectedIndex];
      return o ? clean(o.text) : '';
    }
    if (el.tagName === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio')) {
      return el.checked ? 'checked' : 'unchecked';
    }
    if (el.tagName === 'INPUT' && el.type === 'password') return el.value ? '********' : '';
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') return el.value || '';
    return null;
  }
  function walk(node, doc, win) {
    if (node.nodeType === 3) { out.push(node.nodeValue); return; }
    if (node.nodeType !== 1) return;
    const el = node;
    if (SKIP.has(el.tagName)) return;
    if (el.hasAttribute('data-som-id')) el.removeAttribute('data-som-id');
    const s = win.getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden') return;
    // Scrolled down: what lies wholly above the viewport is not shown (nor numbered).
    if (opts.fromViewport && win === window && el.getBoundingClientRect().bottom <= 0) return;
    if (opts.marks && el.matches(INTERACTIVE) && !el.disabled && rendered(el, win)) {
      if (next > opts.maxLabels) { out.push(clean(el.innerText)); return; }
      const id = next++;
      el.setAttribute('data-som-id', String(id));
      const r = el.getBoundingClientRect();
      const v = value(el);
      const name = label(el, doc).slice(0, 80);
      let text = '[' + id + '] ' + role(el) + ' "' + name.replace(/"/g, "'") + '"';
      if (v !== null) text += ' value="' + String(v).slice(0, 80).replace(/"/g, "'") + '"';
      out.push(' ' + text + ' ');
      elements.push({id, role: role(el), name, value: v, x: r.x, y: r.y, w: r.width, h: r.height});
      return;
    }
    if (el.tagName === 'IFRAME') {
      try {
        const d = el.contentDocument;
        if (d && d.body) { out.push('\n'); walk(d.body, d, d.defaultView); out.push('\n'); }
      } catch (e) { /* cross-origin: not ours to read */ }
      return;
    }
    const block = BLOCK.has(el.tagName) || s.display === 'block' || s.display === 'list-item';
    if (block) out.push('\n');
    if (el.tagName === 'TD' || el.tagName === 'TH') out.push(' ');
    for (const child of el.childNodes) walk(child, doc, win);
    if (block) out.push('\n');
  }
  walk(document.body, document, window);
  const text = out.join('').split('\n').map(l => l.replace(/[ \t\u00a0]+/g, ' ').trim())
    .filter(l => l).join('\n');
  return {text, elements, title: document.title, url: location.href};
}
