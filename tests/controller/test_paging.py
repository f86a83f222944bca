"""Large views come in bounded pages that follow each other without gaps or repeats."""

import asyncio
from types import SimpleNamespace

import httpx

from controller.core.commands import RegisterAgent
from controller.service.paging import PAGE_MAX, event_page, host_page


async def follow(http, path: str) -> tuple[list[dict], int]:
    """Every item of a paged view, following Link: rel=next; and the number of pages."""
    items, pages, url = [], 0, path
    while url:
        reply = await http.get(url)
        assert reply.status_code == 200, reply.text
        page = reply.json()
        assert len(page) <= PAGE_MAX
        items += page
        pages += 1
        link = reply.headers.get("link")
        url = link[1:link.index(">")] if link else None
    return items, pages


async def test_hosts_are_paged_by_id(server):
    ids = [f"h{i:05d}" for i in range(2 * PAGE_MAX + 345)]
    await asyncio.gather(*(server.apply(RegisterAgent(host_id, "i", spare=True)) for host_id in reversed(ids)))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        items, pages = await follow(http, "/api/v1/hosts")
        assert [h["host_id"] for h in items] == ids and pages == 3
        small = await http.get("/api/v1/hosts", params={"limit": 10, "after": "h00100"})
        assert [h["host_id"] for h in small.json()] == ids[101:111]
        assert 'after=h00110' in small.headers["link"]
        too_big = await http.get("/api/v1/hosts", params={"limit": PAGE_MAX + 1})
        assert too_big.status_code == 422
        assert "secret_hash" not in str(items[0])


async def test_events_are_paged_by_sequence_number(server):
    # each registration is one event ("host e00042 registered: spare pool")
    await asyncio.gather(*(server.apply(RegisterAgent(f"e{i:05d}", "i", spare=True)) for i in range(1500)))
    state = server.state
    first = state.events[0].seq  # the window keeps the newest recent_events (1000)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        newest = (await http.get("/api/v1/events", params={"limit": 5})).json()
        assert [e["subject"] for e in newest] == [f"e{i:05d}" for i in range(1495, 1500)]
        items, pages = await follow(http, f"/api/v1/events?limit=400&after={first - 1}")
        assert [e["seq"] for e in items] == list(range(first, first + len(state.events))) and pages == 3
        later = (await http.get("/api/v1/events", params={"after": items[-1]["seq"]})).json()
        assert later == []


def test_page_arithmetic():
    ids = [f"h{i}" for i in range(5)]
    assert host_page(ids, "", 2) == (["h0", "h1"], "h1")
    assert host_page(ids, "h3", 2) == (["h4"], None)
    assert host_page(ids, "zzz", 2) == ([], None)
    events = [SimpleNamespace(seq=seq) for seq in range(10, 15)]
    assert event_page(events, None, 2) == (events[3:], None)
    assert event_page(events, 9, 2) == (events[:2], 11)
    assert event_page(events, 3, 2) == (events[:2], 11)  # older than the window: from its start
    assert event_page(events, 14, 2) == ([], None)
