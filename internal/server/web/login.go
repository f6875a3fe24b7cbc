package web

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
)

// CSRFCookieName carries the sign-in form's anti-forgery token: the form posts it back in its
// csrf field, and a cross-site page can neither read the cookie nor make the browser send it
// (SameSite=Strict).
const CSRFCookieName = "tfstackplan_csrf"

// maxLoginBody bounds the sign-in form.
const maxLoginBody = 64 << 10

// crossOrigin refuses browser POSTs from other origins (Sec-Fetch-Site, else Origin against
// Host).
var crossOrigin = http.NewCrossOriginProtection()

// LoginPage answers an unauthenticated page request with a token form (429 with Retry-After
// when err says the client is throttled).
func LoginPage(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := http.StatusUnauthorized, "Paste an API token to read this page."
	switch {
	case errors.Is(err, throttle.ErrThrottled):
		throttled(w, r, err, r.URL.RequestURI())
		return
	case errors.Is(err, auth.ErrNoRoles):
		status, msg = http.StatusForbidden, "This token may not read these pages."
	case errors.Is(err, ErrSessionEnded):
		msg = "Your session ended: sign in again."
	}
	loginForm(w, r, status, msg, r.URL.RequestURI())
}

// throttled answers a throttled client with the sign-in form, 429 and Retry-After.
func throttled(w http.ResponseWriter, r *http.Request, err error, next string) {
	var te *throttle.Error
	if errors.As(err, &te) {
		w.Header().Set("Retry-After", throttle.RetryAfter(te.Wait))
	}
	loginForm(w, r, http.StatusTooManyRequests, throttledMessage(err), next)
}

// loginForm renders the sign-in form with msg, keeping a valid anti-forgery cookie or setting a
// new one.
func loginForm(w http.ResponseWriter, r *http.Request, status int, msg, next string) {
	token := ""
	if c, err := r.Cookie(CSRFCookieName); err == nil && validCSRF(c.Value) {
		token = c.Value
	} else {
		token = rand.Text()
		http.SetCookie(w, &http.Cookie{Name: CSRFCookieName, Value: token, Path: "/ui/login", MaxAge: int((12 * time.Hour).Seconds()),
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	}
	w.Header().Set("Cache-Control", "no-store")
	renderStatus(w, status, "login", page{Title: "Sign in", Error: msg, Next: safeNext(next), CSRF: token})
}

// validCSRF reports whether v looks like a token loginForm made (rand.Text: 26 base32 letters).
func validCSRF(v string) bool {
	if len(v) != 26 {
		return false
	}
	for _, c := range v {
		if (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// secure reports whether the browser reached us over HTTPS (directly or through a proxy).
func secure(r *http.Request) bool {
	return r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"
}

// login checks the sign-in form (same origin, anti-forgery token, a client that is not
// throttled, a token that verifies and may read the pages), starts a session, hands the browser
// its id in a cookie and sends it on to a page of this site. A failed sign-in counts against the
// client's address, and against the principal when the token verified.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	// What headers decide is refused before the body is read.
	refuse := func(status int, msg string) {
		EndConnection(w, r)
		loginForm(w, r, status, msg, "/")
	}
	if err := crossOrigin.Check(r); err != nil {
		refuse(http.StatusForbidden, "This sign-in came from another site: sign in from this page.")
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		EndConnection(w, r)
		http.Error(w, "the sign-in form is sent as application/x-www-form-urlencoded", http.StatusUnsupportedMediaType)
		return
	}
	cookie, err := r.Cookie(CSRFCookieName)
	if err != nil || !validCSRF(cookie.Value) {
		refuse(http.StatusForbidden, "The sign-in form expired: sign in again.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		formError(w, err)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(cookie.Value)) != 1 {
		loginForm(w, r, http.StatusForbidden, "The sign-in form expired: sign in again.", next)
		return
	}
	// The throttle answers failures only: a token that verifies signs in from any address.
	p, err := u.verify(r.Context(), r.PostForm.Get("token"))
	if err == nil && !p.Has(auth.RoleViewer) {
		err = fmt.Errorf("%w: %s may not read the pages", auth.ErrNoRoles, p.Name)
	}
	if err != nil {
		known := ""
		if errors.Is(err, auth.ErrNoRoles) {
			known = p.Name
		}
		switch terr := u.Throttle.Fail(r, known); {
		case terr != nil:
			throttled(w, r, terr, next)
		case known != "":
			loginForm(w, r, http.StatusForbidden, "This token may not read these pages.", next)
		default:
			loginForm(w, r, http.StatusUnauthorized, "That token was not accepted.", next)
		}
		return
	}
	id, ttl, err := u.newSession(r.Context(), p, r.PostForm.Get("token"))
	switch {
	case errors.Is(err, ErrSessionEnded):
		loginForm(w, r, http.StatusUnauthorized, "That token has expired.", next)
		return
	case errors.Is(err, errTooManySignIns):
		w.Header().Set("Retry-After", "60")
		loginForm(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many sign-ins as %s in the last minute: try again in a minute.", p.Name), next)
		return
	case err != nil:
		u.fail(w, err)
		return
	}
	setSessionCookie(w, r, id, ttl)
	http.SetCookie(w, &http.Cookie{Name: CSRFCookieName, Path: "/ui/login", MaxAge: -1})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// EndConnection makes the answer about to be written the connection's last and gives up on the
// rest of r's body: a client refused on its headers must not hold the connection with a slow
// body (http.Server would otherwise read up to 256 KiB of it before closing).
func EndConnection(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 {
		return
	}
	w.Header().Set("Connection", "close")
	rc := http.NewResponseController(w)
	// Read at most one byte of the body, for a moment: past a zero limit the server marks the
	// body too large and, after the answer, half-closes the connection and gives the client
	// time to read the answer. Closing outright with the body unread would reset the
	// connection under a client still writing it, and the client would never see why.
	_ = rc.SetReadDeadline(time.Now().Add(endReadWait))
	_, _ = http.MaxBytesReader(unwrap(w), r.Body, 0).Read(make([]byte, 1))
	_ = rc.SetReadDeadline(time.Now())
}

// endReadWait bounds how long EndConnection waits for a refused request's body to start.
const endReadWait = 100 * time.Millisecond

// unwrap returns the innermost ResponseWriter of wrappers that have an Unwrap method.
func unwrap(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}

// verify returns the principal of a token (under --insecure-no-auth, everyone's).
func (u *UI) verify(ctx context.Context, token string) (auth.Principal, error) {
	if u.Auth.Insecure {
		return auth.Anonymous, nil
	}
	return u.Auth.Verify(ctx, token)
}

// safeNext returns next if it is a path of this site, else "/". Browsers read "/\" like "//"
// (another host) and drop tabs and newlines, so besides a leading "//" it refuses backslashes and
// control characters, percent-decoded too, and anything with a scheme or host.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	decoded, err := url.PathUnescape(next)
	if err != nil || strings.HasPrefix(decoded, "//") {
		return "/"
	}
	for _, s := range []string{next, decoded} {
		for _, c := range s {
			if c == '\\' || c < 0x20 || c == 0x7f {
				return "/"
			}
		}
	}
	if u, err := url.Parse(next); err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/"
	}
	return next
}
