/* The order of search results (Sphinx's Scorer, set by html_search_scorer in conf.py):
   pages whose own title holds every word of the query come first, guides before the
   other pages among them, then sections whose title does; then Sphinx's own order
   (title words, then text, then name). */
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    const query = new URLSearchParams(window.location.search).get('q') || '';
    // Stemmed as Sphinx stems the index: "channels" matches a title's "channel".
    const stem = typeof Stemmer === 'undefined' ? (w) => w : (w) => new Stemmer().stemWord(w);
    const words = query.toLowerCase().split(/\s+/).filter((w) => w && !w.startsWith('-')).map(stem);
    const pageTitle = (title || '').toLowerCase();
    const titleMatch = words.length > 0 && words.every((w) => pageTitle.includes(w));
    if (!titleMatch) return score;
    // A page's own title (no anchor) before a section's of another page: the structured
    // guide before the language models guide's section "Structured pruning".
    const guide = docname.startsWith('guides/');
    const page = !anchor || anchor === '#';
    return score + (page ? (guide ? 400 : 200) : guide ? 150 : 100);
  },

  // Sphinx's defaults for the rest.
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: {0: 15, 1: 5, 2: -5},
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
