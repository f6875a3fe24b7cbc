package job

// The job's outputs: the terminal summary, the GitHub outputs and annotations, the PR comment
// file, the step summary and the result document.

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// writeOutputs writes the terminal summary, the GitHub outputs, the comment file and the result.
func (r *run) writeOutputs() {
	res := r.res
	// A line per stack and per destroyed resource, the plans and the annotations: one write to
	// stdout, not one each.
	out := bufio.NewWriterSize(r.out, 64<<10)
	if r.report != nil {
		r.report.Environment, r.report.Dir, r.report.Notes = res.Environment, r.tierRel, r.notes()
	}
	if r.report != nil && !r.o.DryRun {
		fmt.Fprintln(out)
		if err := plan.Text(out, r.report, r.o.Color); err != nil {
			r.warn("summary: %v", err)
		}
	}
	if res.Matrix != nil {
		// stdout is the matrix's one JSON line: the summary goes to stderr.
		r.terminalSummary(r.errOut)
		line, _ := jsonMarshalNoHTML(res.Matrix.GitHub())
		fmt.Fprintf(out, "%s\n", line)
	} else {
		r.terminalSummary(out)
		r.driftSummary(out)
	}
	if r.gh.Actions {
		r.annotateNeeds(out)
		if res.Error != nil && res.Error.Kind != KindScript {
			annotateError(out, "tfstackplan "+res.Op, res.Error.Kind+" error in "+res.Error.Step+": "+tailOf(res.Error.Tail, 1024))
		}
		// The warnings were printed as they came, some inside the script run's folded group:
		// the annotations show them on the run's page too.
		for i, w := range res.Warnings {
			if i == maxWarningAnnotations {
				annotate(out, "warning", "tfstackplan "+res.Op, fmt.Sprintf("%d more warnings: see the result document", len(res.Warnings)-i))
				break
			}
			annotate(out, "warning", "tfstackplan "+res.Op, w)
		}
	}
	_ = out.Flush()
	r.writeIssueFile()
	if r.report != nil {
		// A shard's comment would be a part of the plan: the merge writes the comment.
		if r.o.CommentFile != "" && r.o.Shard == "" {
			if err := writeFileAtomic(r.o.CommentFile, []byte(plan.Comment(r.report)), 0o644); err != nil {
				r.warn("comment file: %v", err)
			}
		}
		if r.gh.StepSummary != "" {
			if err := appendFile(r.gh.StepSummary, plan.Markdown(r.report)); err != nil {
				r.warn("step summary: %v", err)
			}
		}
	}
	path := r.o.ResultPath
	if path == "" {
		path = DefaultResultPath(r.getenv)
	}
	if r.gh.Output != "" {
		var changed []string
		for _, e := range res.Stacks {
			if e.Class != events.ClassNoChanges {
				changed = append(changed, e.Stack)
			}
		}
		if changed == nil {
			changed = []string{}
		}
		cj, _ := jsonMarshalNoHTML(changed)
		abs, _ := filepath.Abs(path)
		kv := [][2]string{
			{"execution", res.Execution}, {"status", res.Status}, {"class", string(res.Class)},
			{"has-changes", fmt.Sprint(res.HasChanges)}, {"has-destructive", fmt.Sprint(res.HasDestructive)},
			{"changed-stacks", string(cj)}, {"result", abs}, {"execution-url", res.ExecutionURL},
		}
		if r.o.CommentFile != "" && r.o.Shard == "" {
			kv = append(kv, [2]string{"comment-file", r.o.CommentFile})
		}
		if res.Matrix != nil {
			mj, _ := jsonMarshalNoHTML(res.Matrix.GitHub())
			kv = append(kv, [2]string{"matrix", string(mj)}, [2]string{"shards", fmt.Sprint(len(res.Matrix.Shards))})
		}
		kv = append(kv, r.driftOutputs()...)
		if err := writeOutputs(r.gh.Output, kv); err != nil {
			r.warn("GITHUB_OUTPUT: %v", err)
		}
	}
	if err := WriteResult(path, res); err != nil {
		res.Warnings = append(res.Warnings, "result document: "+err.Error())
		fmt.Fprintln(r.errOut, "tfstackplan: error: could not write the result document:", err)
	}
}

// terminalSummary prints one line per stack and names every destroyed, replaced and forgotten
// resource by address, then the outcome.
func (r *run) terminalSummary(w io.Writer) {
	res := r.res
	fmt.Fprintf(w, "\ntfstackplan %s %s: %s", res.Op, res.Environment, res.Status)
	if res.ExecutionURL != "" {
		fmt.Fprintf(w, " (%s)", res.ExecutionURL)
	}
	fmt.Fprintln(w)
	for _, e := range res.Stacks {
		cls := string(e.Class)
		if cls == "" {
			cls = "-"
		}
		fmt.Fprintf(w, "  %-10s %-13s %s\n", e.Status, cls, plan.Printable(e.Path))
		if s := r.classed[e.Path]; s != nil {
			// The result document names them all; a terminal gets the first MaxDestructive.
			list, more := s.Destructive, s.DestructiveOmitted
			if len(list) > plan.MaxDestructive {
				list, more = list[:plan.MaxDestructive], more+len(list)-plan.MaxDestructive
			}
			for _, c := range list {
				fmt.Fprintf(w, "      %s\n", c.Head())
			}
			if more > 0 {
				fmt.Fprintf(w, "      … and %d more destructive changes (the result document names them all)\n", more)
			}
		}
	}
	if res.Gate != nil {
		fmt.Fprintf(w, "gate: %s", res.Gate.Verdict)
		if res.Gate.Requester != "" {
			fmt.Fprintf(w, " (requester %s)", res.Gate.Requester)
		}
		fmt.Fprintln(w)
	}
	r.needsSummary(w)
	if res.Error != nil {
		fmt.Fprintf(w, "error (%s, %s): %s\n", res.Error.Kind, res.Error.Step, plan.PrintableText(tailOf(res.Error.Tail, 2048)))
	}
}

// truncate cuts s to n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
