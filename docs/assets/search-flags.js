// The site's search (Material for MkDocs, lunr) reads a leading "-" as "leave out pages with this word", so a flag
// typed as a reader types it, `--num_epochs`, found nothing. Each word's leading dashes are dropped from the query
// the page sends to the search worker (the search box still shows what was typed). Message type 2 is Material's
// SearchMessageType.QUERY; tests/test_browser.py searches `--num_epochs` and fails if this stops working.
(function () {
  var post = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (message) {
    if (message && message.type === 2 && typeof message.data === "string") {
      arguments[0] = Object.assign({}, message, { data: message.data.replace(/(^|\s)-+(?=[^\s-])/g, "$1") });
    }
    return post.apply(this, arguments);
  };
})();
