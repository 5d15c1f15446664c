"""Mock Notion: pages made of blocks (paragraphs and to-do items) with search, read and edits.

State: `Page` records (id, title) and their `Block`s (id, type, text, checked). Blocks are separate
records in the diff (world.py), so a check can tell "one to-do was ticked" from "the page was
rewritten". New ids come from counters kept in the state, so a replayed episode gets the same ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envs.apps.base import ToolError, tool

BLOCK_TYPES = ("paragraph", "todo")


@dataclass
class Block:
    id: str
    type: str
    text: str
    checked: bool = False


@dataclass
class Page:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    created: str = ""


@dataclass
class Notion:
    pages: dict[str, Page] = field(default_factory=dict)
    next_page: int = 1
    next_block: int = 1
    today: str = ""

    def add_page(self, data: dict[str, Any]) -> None:
        blocks = [Block(**b) for b in data.get("blocks", [])]
        page = Page(id=data["id"], title=data["title"], blocks=blocks, created=data.get("created", ""))
        assert page.id not in self.pages, f"duplicate page id {page.id}"
        self.pages[page.id] = page

    def to_json(self) -> dict[str, Any]:
        return {
            "next_page": self.next_page,
            "next_block": self.next_block,
            "today": self.today,
            "pages": [asdict(p) for p in self.pages.values()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Notion:
        n = cls(next_page=data["next_page"], next_block=data["next_block"], today=data["today"])
        for p in data["pages"]:
            n.add_page(p)
        return n

    def records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for p in self.pages.values():
            out[f"notion/pages/{p.id}"] = {"id": p.id, "title": p.title, "created": p.created}
            for i, b in enumerate(p.blocks):
                out[f"notion/blocks/{p.id}/{b.id}"] = {**asdict(b), "position": i}
        return out

    def _page(self, page_id: str) -> Page:
        if page_id not in self.pages:
            raise ToolError(f"notion: no page with id {page_id!r}; use notion.search to find ids")
        return self.pages[page_id]

    def _new_block(self, text: str, type: str) -> Block:
        if type not in BLOCK_TYPES:
            raise ToolError(f"notion: block type must be one of {list(BLOCK_TYPES)}, got {type!r}")
        b = Block(id=f"b{self.next_block:04d}", type=type, text=text)
        self.next_block += 1
        return b

    # --- tools -----------------------------------------------------------------------------
    @tool("read")
    def search(self, query: str) -> list[dict[str, Any]]:
        """Find pages whose title contains the query (case-insensitive); returns id and title.

        Args:
            query: text to look for in page titles
        """
        q = query.lower().strip()
        hits = [p for p in self.pages.values() if q in p.title.lower()]
        return [{"id": p.id, "title": p.title} for p in sorted(hits, key=lambda p: p.id)]

    @tool("read")
    def get_page(self, page_id: str) -> dict[str, Any]:
        """Return a page with all its blocks.

        Args:
            page_id: the id from notion.search
        """
        p = self._page(page_id)
        return {"id": p.id, "title": p.title,
                "blocks": [asdict(b) for b in p.blocks]}

    @tool("write")
    def create_page(self, title: str, text: str = "") -> dict[str, Any]:
        """Create a page, optionally with one paragraph of text.

        Args:
            title: page title
            text: first paragraph
        """
        if not title.strip():
            raise ToolError("notion.create_page: the title must not be empty")
        pid = f"p{self.next_page:04d}"
        self.next_page += 1
        blocks = [self._new_block(text, "paragraph")] if text else []
        self.pages[pid] = Page(id=pid, title=title, blocks=blocks, created=self.today)
        return {"id": pid}

    @tool("write")
    def append_block(self, page_id: str, text: str, type: str = "paragraph") -> dict[str, Any]:
        """Add a block at the end of a page.

        Args:
            page_id: the page
            text: block text
            type: paragraph or todo
        """
        p = self._page(page_id)
        b = self._new_block(text, type)
        p.blocks.append(b)
        return {"page_id": p.id, "block_id": b.id}

    @tool("write")
    def update_block(
        self, page_id: str, block_id: str, text: str | None = None, checked: bool | None = None
    ) -> dict[str, Any]:
        """Change a block's text, or tick / untick a to-do.

        Args:
            page_id: the page
            block_id: the block
            text: new text
            checked: new state of a to-do
        """
        p = self._page(page_id)
        for b in p.blocks:
            if b.id == block_id:
                if text is not None:
                    b.text = text
                if checked is not None:
                    if b.type != "todo":
                        raise ToolError("notion.update_block: only todo blocks can be checked")
                    b.checked = checked
                return asdict(b)
        raise ToolError(f"notion.update_block: page {page_id!r} has no block {block_id!r}")
