package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// approveScreenshot is the picture of the Approve form docs/walkthrough.md shows, written by
// TestBrowserApprove when TFSTACKPLAN_UPDATE_SCREENSHOTS=1.
const approveScreenshot = "../../docs/images/approve-page.png"

// browser starts headless Chromium (TFSTACKPLAN_TEST_CHROMIUM; the test is skipped without it)
// with its own profile and a window of width by height, and returns its context.
func browser(t *testing.T, width, height int) context.Context {
	t.Helper()
	chromium := os.Getenv("TFSTACKPLAN_TEST_CHROMIUM")
	if chromium == "" {
		t.Skip("TFSTACKPLAN_TEST_CHROMIUM is unset: set it to a chromium binary (scripts/test.sh installs Debian's chromium and sets it) to run the browser test")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(cancelCtx)
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// signInAt opens path in the browser and signs in with token through the sign-in form.
func signInAt(t *testing.T, ctx context.Context, url, token string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`main`)),
	); err != nil {
		t.Fatalf("sign in at %s: %v", url, err)
	}
}

// browserTrue waits until js is true in the page, failing with the page's text otherwise.
func browserTrue(t *testing.T, ctx context.Context, what, js string) {
	t.Helper()
	ok, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil || !ok {
		text, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		t.Fatalf("%s: %v (page: %.800s)", what, err, text)
	}
}

// TestBrowserApprove drives real headless Chromium: an admin approves a plan's gate on its page,
// after which the apply's gate check is allowed; a page loaded before a newer plan arrived is
// refused with a message naming that plan; a viewer sees the gate and no form.
func TestBrowserApprove(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	// After the server, so that the browser closes (ending its streams) before the server does.
	ctx := browser(t, 1200, 760)
	ts.seedReviewPlan(t, "plan-1", firstPlanHash)

	signInAt(t, ctx, ts.URL+"/ui/executions/plan-1", tokenOf["admin"])
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`form.approve input[name="reason"]`), "reviewed: the old database goes, its data was migrated")); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("TFSTACKPLAN_UPDATE_SCREENSHOTS") == "1" {
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(approveScreenshot), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(approveScreenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if status, _ := ts.gateCheck(t, "apply-1", firstPlanHash); status != 403 {
		t.Fatalf("gate check before approving: %d, want 403", status)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`form.approve button`)), chromedp.WaitVisible(chromedp.CSS(`#approvals span.yes`))); err != nil {
		t.Fatal(err)
	}
	browserTrue(t, ctx, "the gate shows satisfied", `document.querySelector("#approvals .yes") !== null && document.querySelector("#approvals").textContent.includes("by alice")`)
	browserTrue(t, ctx, "no Approve form once satisfied", `document.querySelector("form.approve") === null`)
	if status, out := ts.gateCheck(t, "apply-1", firstPlanHash); status != 200 {
		t.Fatalf("gate check after approving in the browser: %d %v", status, out)
	}

	// A stale page: plan-2 is open with its form filled in when plan-3 arrives.
	ts.seedReviewPlan(t, "plan-2", "v1:2222222222222222222222222222222222222222222222222222222222222222")
	if err := chromedp.Do(ctx,
		chromedp.Navigate(ts.URL+"/ui/executions/plan-2"),
		chromedp.WaitVisible(chromedp.CSS(`form.approve`)),
		chromedp.SendKeys(chromedp.CSS(`form.approve input[name="reason"]`), "looks fine"),
	); err != nil {
		t.Fatal(err)
	}
	ts.seedReviewPlan(t, "plan-3", "v1:3333333333333333333333333333333333333333333333333333333333333333")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`form.approve button`)), chromedp.WaitVisible(chromedp.CSS(`#notice`))); err != nil {
		t.Fatal(err)
	}
	browserTrue(t, ctx, "the stale page is refused, naming the newer plan",
		`(function(){var n=document.querySelector("#notice");return n!==null&&n.textContent.includes("Not approved")&&n.textContent.includes("newer plan")&&n.textContent.includes("plan-3")})()`)
	browserTrue(t, ctx, "the refused page offers no form for the stale plan", `document.querySelector("form.approve") === null`)

	// A viewer sees the gate, its stacks and hashes, and no form.
	vctx := browser(t, 390, 844)
	signInAt(t, vctx, ts.URL+"/ui/executions/plan-3", tokenOf["viewer"])
	browserTrue(t, vctx, "the viewer sees the gate", `(function(){var a=document.querySelector("#approvals"),h=document.querySelector("#approvals code.hash");return a!==null&&h!==null&&a.textContent.includes("stacks/prod/db")&&h.textContent.startsWith("v1:3333")})()`)
	browserTrue(t, vctx, "the viewer has no form", `document.querySelector("form.approve") === null && document.querySelector("form.revoke") === null`)
}
