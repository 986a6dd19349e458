// Package console is the live sale console that `stockctl serve --console`
// serves under /console/ on the API's address: one page of hand-written
// HTML, CSS and JavaScript (assets/, embedded here; no build step) that
// reads everything through the public API, with Connect's JSON protocol
// over fetch, and the bearer token the user enters (kept in the tab's
// sessionStorage, never in a URL). docs/console.md describes it.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// Path is where the console is served: its index is Path, its assets
// Path + "<name>".
const Path = "/console/"

//go:embed assets
var assets embed.FS

// Assets is the console's files, at their names under Path.
func Assets() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory exists
	}
	return sub
}

// Handler serves the console's files under Path (and redirects "/console"
// there). They need no token: the page asks for one, and every API call it
// makes carries it. A URL with a query string is refused, so that a token
// pasted there is not served (nor encouraged). The answers forbid framing, inline scripts and any
// origin but the server's own, and are not cached, so that a new serve's
// console is the one loaded.
func Handler() http.Handler {
	files := http.StripPrefix(Path, http.FileServerFS(Assets()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == strings.TrimSuffix(Path, "/") {
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
			return
		}
		if r.URL.RawQuery != "" {
			// The console takes nothing in its URL: a token put there by
			// mistake would end up in proxies' and servers' logs.
			http.Error(w, "the console takes no query string: sign in on the page (the token is never part of a URL)", http.StatusBadRequest)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
