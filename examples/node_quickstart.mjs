// Start a run that asks for approval, stream its steps, approve the call, print the result.
// Needs AGENTRUN_HTTP_URL, AGENTRUN_API_KEY (starts the run), AGENTRUN_APPROVER_KEY (decides),
// the agent of examples/triage.yaml, and `npm run build` in clients/typescript.
import { AgentRun } from "../clients/typescript/dist/index.js";

const client = new AgentRun();
const approver = new AgentRun({ apiKey: process.env.AGENTRUN_APPROVER_KEY });
const { run } = await client.startRun("triage", "Follow up with ada@example.com");
console.log(`started ${run.run_id}`);
for await (const event of client.watch(run.run_id)) {
  if (event.type === "step") console.log(`step ${event.step.seq}: ${event.step.kind}`);
  if (event.type === "run") console.log(`status: ${event.run.status} ${event.run.wait_reason}`.trim());
  if (event.type !== "run" || event.run.status !== "waiting") continue;
  for await (const approval of client.listApprovals({ state: "pending" })) {
    if (approval.run_id !== run.run_id) continue;
    console.log(`approving ${approval.tool} ${JSON.stringify(approval.arguments)}`);
    await approver.approve(approval.approval_id);
  }
}
const done = await client.getRun(run.run_id);
console.log(`result: ${typeof done.output === "string" ? done.output : JSON.stringify(done.output)}`);
process.exitCode = done.status === "completed" ? 0 : 1;
