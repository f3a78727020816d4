"""The grading kernel's client (``autograder.host.kernel.ReadyClient``) is ready once the kernel
has answered ``kernel_info`` and published that request's idle status: what the kernel printed
as it started is read then, and never reaches the first cell's outputs, as with
jupyter_client's own wait (a fifth of a second of silence on IOPub)."""

from __future__ import annotations

import asyncio

from autograder.host.kernel import ReadyClient, SandboxedKernelManager

STARTUP = "printed as the kernel started"


async def _first_cell_outputs(tmp_path, client_class: str) -> list[str]:
    tmp_path.mkdir()
    manager = SandboxedKernelManager(sandbox=False, scratch=str(tmp_path),
                                     client_class=client_class)
    # printed from exec_lines, as the grader's arming runs before the first cell
    await manager.start_kernel(extra_arguments=[
        f"--IPKernelApp.exec_lines=print({STARTUP!r})"])
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        asked = client.execute("print('the first cell')")
        texts = []
        while True:
            message = await client.get_iopub_msg(timeout=60)
            if message["parent_header"].get("msg_id") != asked:
                texts.append(f"not the cell's: {message['msg_type']}")
                continue
            if message["msg_type"] == "stream":
                texts.append(message["content"]["text"])
            if message["msg_type"] == "status" and \
                    message["content"]["execution_state"] == "idle":
                return texts
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


def test_the_grading_kernels_client_is_the_ready_client(tmp_path):
    manager = SandboxedKernelManager(sandbox=False, scratch=str(tmp_path))
    assert isinstance(manager.client(), ReadyClient)


def test_what_the_kernel_printed_as_it_started_is_not_the_first_cells(tmp_path):
    ours = asyncio.run(_first_cell_outputs(tmp_path / "ours", "autograder.host.kernel.ReadyClient"))
    stock = asyncio.run(_first_cell_outputs(
        tmp_path / "stock", "jupyter_client.asynchronous.AsyncKernelClient"))
    assert ours == stock == ["the first cell\n"], (ours, stock)
