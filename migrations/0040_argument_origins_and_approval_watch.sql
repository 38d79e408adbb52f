-- Where a held call's untrusted argument values came from (issue 48).
--
-- An untrusted_value constraint holds a call whose arguments carry a value that first
-- appeared in untrusted content (a tool's result, an inbound mail or webhook); the
-- approver must see each value's origin ("first appeared in the result of `read_thread`
-- step 3"), in the console, Slack and the CLI. The executor computes the origins from the
-- run's log and sends them with the ApprovalRequest; they are kept with the approval,
-- as a JSON array of ArgumentOrigin objects ([] for every other approval).
ALTER TABLE approvals ADD COLUMN argument_origins jsonb NOT NULL DEFAULT '[]';

-- An approver who approves everything quickly is flagged to the workspace's admins
-- (issue 48, "approvers are warned"): the workspace sets the rate as
-- {"approvals", "window_seconds", "max_decide_seconds"} (NULL: no watch).
ALTER TABLE workspaces ADD COLUMN approval_watch jsonb;
