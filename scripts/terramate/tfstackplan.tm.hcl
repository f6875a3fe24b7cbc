# tfstackplan script library: terramate configuration.
#
# Copy this file and tfstackplan.scripts.tm.hcl into the root of your terramate project (the
# directory holding your root terramate.tm.hcl) and add the lines of `gitignore` to your
# .gitignore. terramate merges the `terramate` blocks of all files of a directory, but one
# attribute may be set only once: when your project already sets `experiments` or a `run.env`
# variable of the same name, merge these lines into your block instead of keeping both.
# See README.md.

terramate {
  config {
    # `script` blocks are still an experiment in terramate 0.17.
    experiments = ["scripts"]

    run {
      env {
        # Which stack a `tfstackplan run tick` reports on: the stack path relative to the
        # project root, e.g. "stacks/prod/network".
        TFSTACKPLAN_STACK = terramate.stack.path.relative
      }
    }
  }
}

globals {
  # The binary the scripts run: "tofu" (OpenTofu) or "terraform". A name on PATH or a path
  # without spaces. Set it again in a `globals` block of a sub-directory to switch only the
  # stacks below it.
  tfstackplan_tf = "tofu"
}
