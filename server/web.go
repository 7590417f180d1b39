package server

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/labstack/echo/v4"
)

// The browser page (web/: plain HTML and JavaScript, no build step, no
// CDN), embedded in the binary.
//
//go:embed web
var webFiles embed.FS

// webRoutes serves the page at / and its scripts under /web/.
func (s *Server) webRoutes(e *echo.Echo) {
	sub, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the embedded folder exists: a build error otherwise
	}
	files := http.FileServer(http.FS(sub))
	serve := func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self' ws: wss:; style-src 'self' 'unsafe-inline'")
		r := c.Request()
		if r.URL.Path == "/" {
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/index.html"
			// http.FileServer redirects /index.html to /: serve the file itself.
			f, err := sub.Open("index.html")
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			http.ServeContent(c.Response(), r2, "index.html", st.ModTime(), f.(readSeeker))
			return nil
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + c.Param("*")
		files.ServeHTTP(c.Response(), r2)
		return nil
	}
	e.GET("/", serve)
	e.GET("/web/*", serve)
}

type readSeeker interface {
	Read([]byte) (int, error)
	Seek(int64, int) (int64, error)
}
